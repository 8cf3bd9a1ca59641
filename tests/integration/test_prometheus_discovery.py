"""docker/prometheus.yml's scrape job, run by a real Prometheus against a
real server with one (stand-in) worker: the server's HTTP service discovery
lists the gateway and the one worker that exists, and both are scraped up."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from plancache_server.store.embedded_redis import free_port
from tests.support.processes import Proc, free_port_pair

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def test_prometheus_scrapes_the_gateway_and_each_worker_that_exists(tmp_path: Path) -> None:
    binary = shutil.which("prometheus")
    assert binary, "no prometheus: `make setup-test` (scripts/install-os-package.sh) installs Debian's prometheus"
    metrics = free_port_pair()
    server = Proc(
        [
            sys.executable,
            "-m",
            "plancache_server.main",
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--gpus",
            "0",
            "--compiler",
            "tests.support.standin:factory",
            "--unsigned",
            "--build-processes",
            "1",
            "--metrics-port",
            str(metrics),
            "--data-dir",
            str(tmp_path / "data"),
        ],
        tmp_path / "server.log",
    )
    prometheus = None
    try:
        server.wait_for(r"plancache-server listening on")
        listed = _get(f"http://127.0.0.1:{metrics}/prometheus/targets")
        assert listed == [
            {"targets": [f"127.0.0.1:{metrics}"], "labels": {"role": "gateway"}},
            {"targets": [f"127.0.0.1:{metrics + 1}"], "labels": {"role": "worker", "gpu": "0"}},
        ]
        # The compose file's config, pointed at this server instead of the compose service's name.
        config = yaml.safe_load((REPO / "docker" / "prometheus.yml").read_text())
        config["global"]["scrape_interval"] = "1s"
        config["rule_files"] = [str(REPO / "docker" / "prometheus-rules.yml")]
        (job,) = config["scrape_configs"]
        (sd,) = job["http_sd_configs"]
        assert sd["url"] == "http://plancache:9464/prometheus/targets"
        sd["url"] = f"http://127.0.0.1:{metrics}/prometheus/targets"
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        web = free_port()
        prometheus = subprocess.Popen(
            [
                binary,
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{web}",
            ],
            stdout=open(tmp_path / "prometheus.log", "w"),  # noqa: SIM115 - the process holds it
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 90
        while True:
            try:
                active = _get(f"http://127.0.0.1:{web}/api/v1/targets")["data"]["activeTargets"]
                seen = {(t["labels"]["role"], t["labels"].get("gpu"), t["scrapeUrl"], t["health"]) for t in active}
                if seen and all(t["health"] == "up" for t in active):
                    break
            except OSError:
                pass
            assert prometheus.poll() is None and time.monotonic() < deadline, (tmp_path / "prometheus.log").read_text()[
                -3000:
            ]
            time.sleep(0.5)
        assert seen == {
            ("gateway", None, f"http://127.0.0.1:{metrics}/metrics", "up"),
            ("worker", "0", f"http://127.0.0.1:{metrics + 1}/metrics", "up"),
        }
    finally:
        if prometheus is not None:
            prometheus.terminate()
            prometheus.wait(timeout=30)
        server.stop()
