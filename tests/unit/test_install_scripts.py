"""The OS packages `make setup`/`make test` install leave nothing running or
started at boot, and `make test` says what it installs before it does
(scripts/install-os-package.sh, run here against fake apt-get, dpkg and
systemctl: nothing on this machine is installed or changed)."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"

# What each fake package ships (dpkg -L) and the commands its install puts on PATH.
FILES = {
    "prometheus": ["/usr/bin/prometheus", "/lib/systemd/system/prometheus.service", "/etc/init.d/prometheus"],
    "prometheus-common": ["/usr/lib/systemd/system/prometheus-helper.socket", "/usr/share/doc/prometheus-common"],
    "redis-server": [
        "/usr/bin/redis-server",
        "/lib/systemd/system/redis-server.service",
        "/lib/systemd/system/redis-server@.service",
    ],
    "redis-tools": ["/usr/bin/redis-cli"],
    "postgresql": ["/lib/systemd/system/postgresql.service"],  # installed before: never touched
}
PULLS = {"prometheus": ["prometheus", "prometheus-common"], "redis-server": ["redis-server", "redis-tools"]}
COMMANDS = {"prometheus": ["promtool"], "redis-server": ["redis-server"]}

FAKE_APT_GET = """#!/usr/bin/env bash
echo "apt-get $*" >> "$FAKE/log"
if [ "$1" = "update" ]; then exit 0; fi
package="${@: -1}"
if [ -e "$POLICY_RC_D" ] && [ -x "$POLICY_RC_D" ]; then
  set +e; "$POLICY_RC_D" "$package" start; echo "policy-rc.d answered $?" >> "$FAKE/log"; set -e
else
  echo "no policy-rc.d during the install" >> "$FAKE/log"
fi
for p in $(cat "$FAKE/pulls/$package"); do echo "$p" >> "$FAKE/installed"; done
for c in $(cat "$FAKE/commands/$package"); do printf '#!/bin/sh\\n' > "$FAKE/bin/$c"; chmod +x "$FAKE/bin/$c"; done
"""
FAKE_DPKG_QUERY = '#!/usr/bin/env bash\ncat "$FAKE/installed"\n'
FAKE_DPKG = '#!/usr/bin/env bash\n[ "$1" = "-L" ] && cat "$FAKE/files/$2"\n'
FAKE_LOGGER = '#!/usr/bin/env bash\necho "{name} $*" >> "$FAKE/log"\n'
FAKE_SUDO = '#!/usr/bin/env bash\nexec "$@"\n'


def _fake_machine(tmp_path: Path) -> dict[str, str]:
    fake = tmp_path / "fake"
    for sub in ("bin", "files", "pulls", "commands"):
        (fake / sub).mkdir(parents=True)
    for package, files in FILES.items():
        (fake / "files" / package).write_text("\n".join(files) + "\n")
    for package, pulled in PULLS.items():
        (fake / "pulls" / package).write_text("\n".join(pulled) + "\n")
        (fake / "commands" / package).write_text("\n".join(COMMANDS[package]) + "\n")
    (fake / "installed").write_text("base-files\npostgresql\n")
    (fake / "log").write_text("")
    scripts = {
        "apt-get": FAKE_APT_GET,
        "dpkg-query": FAKE_DPKG_QUERY,
        "dpkg": FAKE_DPKG,
        "systemctl": FAKE_LOGGER.format(name="systemctl"),
        "update-rc.d": FAKE_LOGGER.format(name="update-rc.d"),
        "sudo": FAKE_SUDO,
    }
    for name, text in scripts.items():
        path = fake / "bin" / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    # Only the fakes and the basic tools: no real apt-get, systemctl or promtool is found.
    basic = tmp_path / "basic"
    basic.mkdir()
    for tool in (
        "bash",
        "sh",
        "cat",
        "grep",
        "sed",
        "awk",
        "sort",
        "comm",
        "tee",
        "chmod",
        "rm",
        "id",
        "wc",
        "printf",
        "dirname",
    ):
        real = next((Path(d) / tool for d in os.environ["PATH"].split(":") if (Path(d) / tool).exists()), None)
        if real is not None:
            (basic / tool).symlink_to(real)
    return {
        "PATH": f"{fake / 'bin'}:{basic}",
        "FAKE": str(fake),
        "POLICY_RC_D": str(tmp_path / "policy-rc.d"),
        "HOME": str(tmp_path),
    }


def _run(script: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPTS / script), *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def _log(env: dict[str, str]) -> str:
    return (Path(env["FAKE"]) / "log").read_text()


def test_a_package_installs_with_nothing_started_and_its_services_disabled(tmp_path: Path) -> None:
    env = _fake_machine(tmp_path)
    run = _run("install-os-package.sh", env, "promtool", "prometheus")
    assert run.returncode == 0, run.stderr
    log = _log(env)
    assert "policy-rc.d answered 101" in log  # apt could start nothing during the install
    assert not Path(env["POLICY_RC_D"]).exists()  # and the policy is gone after it
    disabled = re.findall(r"^systemctl disable .*?(\S+)$", log, re.M)
    assert sorted(disabled) == ["prometheus-helper.socket", "prometheus.service"]  # what it pulled in too
    assert "update-rc.d prometheus disable" in log  # the init script's boot links
    assert "postgresql" not in log  # a service that was there before is left alone
    assert "disabled prometheus.service (from prometheus)" in run.stderr


def test_an_existing_policy_rc_d_is_left_as_it_was(tmp_path: Path) -> None:
    env = _fake_machine(tmp_path)
    policy = Path(env["POLICY_RC_D"])
    policy.write_text("#!/bin/sh\n# the image's own\nexit 101\n")
    policy.chmod(0o755)
    run = _run("install-os-package.sh", env, "promtool", "prometheus")
    assert run.returncode == 0, run.stderr
    assert policy.read_text() == "#!/bin/sh\n# the image's own\nexit 101\n"


def test_an_installed_command_installs_nothing(tmp_path: Path) -> None:
    env = _fake_machine(tmp_path)
    (Path(env["FAKE"]) / "bin" / "promtool").write_text("#!/bin/sh\n")
    (Path(env["FAKE"]) / "bin" / "promtool").chmod(0o755)
    assert _run("install-os-package.sh", env, "promtool", "prometheus").returncode == 0
    assert _log(env) == ""


def test_redis_goes_the_same_way_and_its_system_instance_is_disabled(tmp_path: Path) -> None:
    env = _fake_machine(tmp_path)
    run = _run("install-redis.sh", env)
    assert run.returncode == 0, run.stderr
    log = _log(env)
    assert "policy-rc.d answered 101" in log
    assert re.findall(r"^systemctl disable .*?(\S+)$", log, re.M) == ["redis-server.service"]  # not the template


def test_the_plan_names_each_missing_package_with_its_size(tmp_path: Path) -> None:
    env = _fake_machine(tmp_path)
    fake = Path(env["FAKE"])
    (fake / "bin" / "apt-get").write_text(
        '#!/usr/bin/env bash\n[ "$1" = "-s" ] || { echo "apt-get $*" >> "$FAKE/log"; exit 1; }\n'
        'echo "Inst chromium (1 Debian)"; echo "Conf chromium (1 Debian)"; echo "Inst chromium-common (1 Debian)"\n'
    )
    (fake / "bin" / "apt-cache").write_text(
        '#!/usr/bin/env bash\nprintf "Package: chromium\\nInstalled-Size: 290288\\n\\nPackage: chromium-common\\nInstalled-Size: 66498\\n"\n'
    )
    (fake / "bin" / "apt-cache").chmod(0o755)
    (fake / "bin" / "redis-server").write_text("#!/bin/sh\n")
    (fake / "bin" / "redis-server").chmod(0o755)
    run = _run("install-os-package.sh", env, "--plan", "chromium=chromium", "redis-server=redis-server")
    assert run.returncode == 0, run.stderr
    assert run.stdout == "  chromium (for chromium): 2 Debian packages, about 348 MB installed\n"
    assert _log(env) == ""  # installs nothing


def test_make_test_says_what_it_installs_before_installing() -> None:
    """The plan is setup-test's first prerequisite (it prints before any installer runs), and it names every
    OS package a `make test` target installs."""
    makefile = (REPO / "Makefile").read_text()
    prerequisites = re.search(r"^setup-test:(.*)$", makefile, re.M)
    assert prerequisites is not None and prerequisites.group(1).split()[0] == "test-plan"
    planned = re.search(r"^TEST_COMMANDS :=(.*)$", makefile, re.M)
    assert planned is not None
    installed = re.findall(r"^\t@?scripts/install-(?:os-package\.sh ([a-z][^ ]*) (\S+)|redis\.sh)", makefile, re.M)
    assert len(installed) >= 5
    for command, package in installed:
        assert f"{command or 'redis-server'}={package or 'redis-server'}" in planned.group(1).split()
    run = subprocess.run(["make", "-s", "test-plan"], cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("make test sets up, where missing:\n")
    assert "left running or enabled at boot" in run.stdout
