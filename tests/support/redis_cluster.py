"""A 3-master Redis Cluster on loopback, from plain redis-server processes."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import redis

from plancache_server.store.embedded_redis import EmbeddedRedis
from tests.support.ports import free_below_ephemeral


def cluster_ports(count: int) -> list[int]:
    """`count` ports whose cluster bus ports (+ 10000) are free too, all below the ephemeral range
    (tests.support.ports)."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_below_ephemeral((0, 10000))
        if port not in ports:
            ports.append(port)
    return ports


class LocalCluster:
    def __init__(self, root: Path, masters: int = 3, replicas: int = 0) -> None:
        """`replicas`: per master (a master killed is then replaced by its replica: a failover)."""
        self.replicas = replicas
        masters = masters * (1 + replicas)
        self.nodes = [
            EmbeddedRedis(
                root / f"node{port}",
                port=port,
                persist=False,
                extra_args=(
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    f"nodes-{port}.conf",
                    "--cluster-node-timeout",
                    "2000",
                ),
            )
            for port in cluster_ports(masters)
        ]

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}/0"

    def start(self) -> LocalCluster:
        for node in self.nodes:
            node.start()
        cli = shutil.which("redis-cli")
        if cli is None:
            raise FileNotFoundError("redis-cli not found (Debian package redis-tools)")
        subprocess.run(
            [
                cli,
                "--cluster",
                "create",
                *(f"127.0.0.1:{n.port}" for n in self.nodes),
                "--cluster-replicas",
                str(self.replicas),
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        deadline = time.monotonic() + 30
        for node in self.nodes:
            client = redis.Redis(port=node.port)
            while b"cluster_state:ok" not in client.execute_command("CLUSTER", "INFO"):
                if time.monotonic() > deadline:
                    raise TimeoutError("the cluster did not reach cluster_state:ok")
                time.sleep(0.1)
            client.close()
        # A replica still in its first sync when its master dies does not take over (its data is too old to:
        # cluster-replica-validity-factor), and the cluster stays down: a test that kills a master waits for
        # every replica's link first (CI's loaded 2 cores once took longer than the test's 2 s of load).
        deadline = time.monotonic() + 60
        for node in self.nodes:
            client = redis.Redis(port=node.port)
            try:
                while True:
                    info = client.info("replication")
                    if info.get("role") != "slave" or info.get("master_link_status") == "up":
                        break
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"replica {node.port} did not finish its first sync")
                    time.sleep(0.1)
            finally:
                client.close()
        return self

    def masters(self) -> list[EmbeddedRedis]:
        """The nodes serving slots now, as the cluster says."""
        found = []
        for node in self.nodes:
            if not node.running():
                continue
            client = redis.Redis(port=node.port, socket_timeout=2)
            try:
                if client.execute_command("ROLE")[0] in (b"master", "master"):
                    found.append(node)
            except redis.RedisError:
                pass
            finally:
                client.close()
        return found

    def healthy(self) -> bool:
        """Whether every live node says cluster_state:ok."""
        for node in self.nodes:
            if not node.running():
                continue
            client = redis.Redis(port=node.port, socket_timeout=2)
            try:
                if b"cluster_state:ok" not in client.execute_command("CLUSTER", "INFO"):
                    return False
            except redis.RedisError:
                return False
            finally:
                client.close()
        return True

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
