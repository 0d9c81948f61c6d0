"""Start the real NDIF server stack (``ndif`` 0.1.x) on this machine, for graft's remote tests.

    python scripts/ndif/harness.py start [--state DIR] [--serve NAME=FOLDER ...]  # prints the
                                                          # API URL, returns when ready
    python scripts/ndif/harness.py stop  [--state DIR]

What runs, all inside a network namespace of its own whose only interface is loopback
(so Ray, which advertises a node address, can only ever advertise 127.0.0.1):

- ``redis-server`` (the request queue and the inline result channel);
- a Ray head node with one logical ``GPU`` and ``cuda_memory_bytes`` resources (the ndif
  controller only places replicas on GPU nodes), and the ndif controller actor;
- the ndif API (gunicorn + uvicorn, its queue dispatcher; served from ``graft_ndif_api.py``,
  which imports anyio before nnsight so that uploads over 1 MiB parse);
- pre-deployed tiny models (``deploy_models.py``): a saved tiny llama served as nnsight's
  ``TransformersModel`` (for ship mode) and a graft pair (base + donor, for hosted mode),
  each behind the CPU model actors of ``graft_ndif_shims.py``: the in-process one and the
  sandboxing one (untrusted requests run in a separate runner process);
- optionally, saved models of your own (``serve``: ``{name: folder}``, each served as
  nnsight's ``TransformersModel`` under the key graft's client sends for that folder).

A relay (``relay.py``) listens on 127.0.0.1 outside the namespace and forwards each
connection to the API on the namespace's loopback, so clients run anywhere on the machine.
``stop`` kills every process inside the namespace (by PID) and the relay, then deletes the
namespace. Needs root (``ip netns``), ``redis-server`` and the server's Python 3.12 venv
(``scripts/ndif/ci.sh`` builds it; ``NDIF_VENV`` or ``--venv`` points at it).

Written for the standard library only, so the client's Python can run it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
DEFAULT_VENV = REPO / ".venv-ndif"
DEFAULT_STATE = REPO / ".ndif-harness"
REDIS_PORT = 6379
RAY_PORT = 6385
RAY_CLIENT_PORT = 10001
API_PORT = 8001
DASHBOARD_PORT = 8265  # Ray's state API, which the ndif controller lists nodes with
GIB = 1024**3


class HarnessError(RuntimeError):
    """The server stack could not be started (message says which step and where its log is)."""


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kwargs)


class Harness:
    """One server stack: its namespace, processes, logs and the relay's URL.

    Args (constructor):
        state: folder for logs, the saved tiny model, Ray's temp files and ``state.json``.
        venv: the server's Python 3.12 virtual environment (with ``ndif[api,ray]`` and graft).
        api_port: the relay's port on 127.0.0.1 outside the namespace (0: any free port).
        serve: more models to deploy, ``{name: folder of a saved model}``; their keys join
            ``models`` under their names.
    """

    def __init__(
        self,
        state: Path = DEFAULT_STATE,
        venv: Path | None = None,
        api_port: int = 0,
        serve: dict[str, Path] | None = None,
    ):
        self.state = Path(state).resolve()
        self.serve = {name: Path(folder).resolve() for name, folder in (serve or {}).items()}
        self.venv = Path(venv or os.environ.get("NDIF_VENV") or DEFAULT_VENV).resolve()
        self.api_port = api_port
        self.netns = f"graft-ndif-{os.getpid()}"
        # Ray's socket paths must stay short (unix sockets: 107 bytes), so not under state/
        self.ray_dir = Path(f"/tmp/graft-ray-{os.getpid()}")
        self.pids: dict[str, int] = {}
        self.url = ""
        self.models: dict = {}
        self.versions: dict = {}
        self.timings: dict[str, float] = {}

    # ----------------------------------------------------------------- helpers
    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")

    def _log(self, name: str) -> Path:
        return self.state / "logs" / f"{name}.log"

    def _env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("NDIF_", "RAY_"))}
        env.update(
            PATH=f"{self.venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}",
            PYTHONPATH=str(HERE),
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"),
            TOKENIZERS_PARALLELISM="false",
            GRPC_ENABLE_FORK_SUPPORT="0",
            RAY_USAGE_STATS_ENABLED="0",
            # Ray's memory monitor kills workers when the MACHINE is nearly full, whoever
            # fills it; on a shared machine that killed the model actors mid-deploy
            RAY_memory_monitor_refresh_ms="0",
            NDIF_REDIS_URL=f"redis://127.0.0.1:{REDIS_PORT}",
            NDIF_RAY_ADDRESS=f"ray://127.0.0.1:{RAY_CLIENT_PORT}",
            NDIF_API_URL=f"http://127.0.0.1:{API_PORT}",
            NDIF_API_PORT=str(API_PORT),
            NDIF_MODEL_IMPORT_PATH="graft_ndif_shims.CPUModelActor",
            NDIF_DEFAULT_DTYPE="float32",
            NDIF_MINIMUM_DEPLOYMENT_TIME_SECONDS="0",
            NDIF_RAY_TEMP_DIR=str(self.ray_dir),
        )
        return env

    def _spawn(self, name: str, cmd: list[str], env: dict | None = None) -> int:
        """Start ``cmd`` inside the namespace in a session of its own; logs to logs/NAME.log."""
        log = open(self._log(name), "ab")  # noqa: SIM115 - the child keeps it
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.netns, *cmd],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env or self._env(),
            cwd=self.state,
            start_new_session=True,
        )
        self.pids[name] = proc.pid
        self._save()
        return proc.pid

    def _exec_ns(self, name: str, cmd: list[str], timeout: float) -> str:
        """Run ``cmd`` in the namespace to completion; its output (raises with the log tail)."""
        with open(self._log(name), "ab") as log:
            try:
                proc = subprocess.run(
                    ["ip", "netns", "exec", self.netns, *cmd],
                    stdout=subprocess.PIPE,
                    stderr=log,
                    env=self._env(),
                    cwd=self.state,
                    timeout=timeout,
                    check=False,
                )
            except subprocess.TimeoutExpired as exc:
                raise HarnessError(
                    f"{name} took over {timeout:g} s; see {self._log(name)}"
                ) from exc
        if proc.returncode != 0:
            raise HarnessError(
                f"{name} failed (exit {proc.returncode}): {self._tail(name)}; see {self._log(name)}"
            )
        return proc.stdout.decode()

    def _tail(self, name: str, n: int = 3) -> str:
        try:
            lines = self._log(name).read_text(errors="replace").strip().splitlines()
        except OSError:
            return "no log"
        return " | ".join(line.strip() for line in lines[-n:]) or "empty log"

    def _wait_port(self, name: str, port: int, timeout: float) -> None:
        """Wait until 127.0.0.1:port inside the namespace accepts connections."""
        probe = (
            "import socket,sys\n"
            "s=socket.socket();s.settimeout(1)\n"
            f"sys.exit(s.connect_ex(('127.0.0.1',{port})))"
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ok = subprocess.run(
                ["ip", "netns", "exec", self.netns, sys.executable, "-c", probe],
                capture_output=True,
                check=False,
            )
            if ok.returncode == 0:
                return
            pid = self.pids.get(name)
            if pid is not None and not _alive(pid):
                raise HarnessError(f"{name} exited: {self._tail(name)}; see {self._log(name)}")
            time.sleep(0.5)
        raise HarnessError(
            f"{name} did not listen on port {port} within {timeout:g} s; see {self._log(name)}"
        )

    def _save(self) -> None:
        data = {
            "netns": self.netns,
            "ray_dir": str(self.ray_dir),
            "pids": self.pids,
            "url": self.url,
            "models": self.models,
            "versions": self.versions,
            "timings": self.timings,
        }
        (self.state / "state.json").write_text(json.dumps(data, indent=2))

    # ------------------------------------------------------------------ start
    def check_prerequisites(self) -> None:
        if os.geteuid() != 0:
            raise HarnessError("the harness needs root: it creates a network namespace")
        for tool in ("ip", "redis-server"):
            if shutil.which(tool) is None:
                raise HarnessError(
                    f"{tool} not found; install it (apt-get install -y redis-server iproute2)"
                )
        if not Path(self.python).exists():
            raise HarnessError(
                f"no server venv at {self.venv}; build it with scripts/ndif/ci.sh --venv-only"
            )

    def start(self, timeout: float = 420.0) -> Harness:
        """Start everything and deploy the tiny models; returns self (``url``, ``models``)."""
        t0 = time.monotonic()
        self.check_prerequisites()
        if self.state.exists():
            stop_from_state(self.state)
            shutil.rmtree(self.state)
        (self.state / "logs").mkdir(parents=True)
        self.ray_dir.mkdir(parents=True, exist_ok=True)
        deadline = t0 + timeout

        def left() -> float:
            return max(deadline - time.monotonic(), 1.0)

        _run(["ip", "netns", "add", self.netns])
        self._save()
        _run(["ip", "netns", "exec", self.netns, "ip", "link", "set", "lo", "up"])

        self._spawn(
            "redis",
            [
                "redis-server",
                "--port",
                str(REDIS_PORT),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.state),
            ],
        )
        self._wait_port("redis", REDIS_PORT, min(30.0, left()))

        resources = json.dumps(
            {"head": 10, "cuda_memory_bytes": 16 * GIB, "cpu_memory_bytes": 8 * GIB}
        )
        self._spawn(
            "ray",
            [
                "ray",
                "start",
                "--head",
                "--block",
                "--node-ip-address=127.0.0.1",
                f"--port={RAY_PORT}",
                f"--ray-client-server-port={RAY_CLIENT_PORT}",
                "--num-cpus=8",
                "--num-gpus=1",
                f"--resources={resources}",
                "--include-dashboard=true",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={DASHBOARD_PORT}",
                "--disable-usage-stats",
                f"--temp-dir={self.ray_dir}",
            ],
        )
        self._wait_port("ray", RAY_CLIENT_PORT, min(120.0, left()))
        self._wait_port("ray", DASHBOARD_PORT, min(120.0, left()))
        self.timings["ray_s"] = round(time.monotonic() - t0, 1)

        controller_env = self._env() | {"RAY_ADDRESS": f"127.0.0.1:{RAY_PORT}"}
        with open(self._log("controller"), "ab") as log:
            proc = subprocess.run(
                [
                    "ip",
                    "netns",
                    "exec",
                    self.netns,
                    self.python,
                    "-m",
                    "ndif.services.ray.deployments.controller.controller",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=controller_env,
                cwd=self.state,
                timeout=left(),
                check=False,
            )
        if proc.returncode != 0:
            raise HarnessError(f"the ndif controller failed: {self._tail('controller')}")

        self._spawn(
            "api",
            [
                self.python,
                "-m",
                "gunicorn",
                "--config",
                "python:ndif.services.api.gunicorn_conf",
                "graft_ndif_api:app",  # ndif's app, importable with uploads over 1 MiB
            ],
        )
        self._wait_port("api", API_PORT, min(120.0, left()))
        self.timings["api_s"] = round(time.monotonic() - t0, 1)

        serve = [arg for name, f in self.serve.items() for arg in ("--serve", f"{name}={f}")]
        out = self._exec_ns(
            "deploy",
            [
                self.python,
                str(HERE / "deploy_models.py"),
                "--dir",
                str(self.state / "models"),
                *serve,
            ],
            timeout=left(),
        )
        self.models = json.loads(out.strip().splitlines()[-1])
        self.timings["deploy_s"] = round(time.monotonic() - t0, 1)

        self._start_relay(min(30.0, left()))
        self.versions = _versions(self.python)
        self.timings["start_s"] = round(time.monotonic() - t0, 1)
        self._save()
        return self

    def _start_relay(self, timeout: float) -> None:
        port = self.api_port or _free_port()
        log = open(self._log("relay"), "ab")  # noqa: SIM115 - the child keeps it
        proc = subprocess.Popen(
            [self.python, str(HERE / "relay.py"), str(port), self.netns, str(API_PORT)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.pids["relay"] = proc.pid
        self._save()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    self.url = f"http://127.0.0.1:{port}"
                    return
            if proc.poll() is not None:
                raise HarnessError(f"the relay exited: {self._tail('relay')}")
            time.sleep(0.2)
        raise HarnessError(f"the relay did not listen on 127.0.0.1:{port}")

    def stop(self) -> None:
        stop_from_state(self.state)


# --------------------------------------------------------------------- teardown


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_all(pids: list[int], grace: float = 5.0) -> None:
    """SIGTERM each PID, wait up to ``grace`` seconds, SIGKILL what is left."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.2)
    for pid in pids:
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _netns_pids(netns: str) -> list[int]:
    out = subprocess.run(
        ["ip", "netns", "pids", netns], capture_output=True, text=True, check=False
    )
    return [int(p) for p in out.stdout.split() if p.strip().isdigit()]


def stop_from_state(state: Path) -> None:
    """Stop a stack started with ``state``: the relay, every process in its namespace, the namespace."""
    path = Path(state) / "state.json"
    if not path.exists():
        return
    data = json.loads(path.read_text())
    netns = data.get("netns")
    relay = data.get("pids", {}).get("relay")
    if relay:
        _kill_all([relay])
    if netns:
        for _ in range(3):  # Ray restarts workers while its raylet lives: sweep until empty
            pids = _netns_pids(netns)
            if not pids:
                break
            _kill_all(pids)
        subprocess.run(["ip", "netns", "delete", netns], capture_output=True, check=False)
    ray_dir = data.get("ray_dir")
    if ray_dir and Path(ray_dir).name.startswith("graft-ray-"):
        shutil.rmtree(ray_dir, ignore_errors=True)
    path.unlink()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _versions(python: str) -> dict:
    code = (
        "import json, importlib.metadata as m, sys\n"
        "print(json.dumps({p: m.version(p) for p in ('ndif','nnsight','torch','transformers','ray')}"
        " | {'python': sys.version.split()[0]}))"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
    try:
        return json.loads(out.stdout)
    except ValueError:
        return {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("start", "stop"))
    parser.add_argument("--state", type=Path, default=DEFAULT_STATE)
    parser.add_argument("--venv", type=Path, default=None)
    parser.add_argument("--port", type=int, default=0, help="relay port on 127.0.0.1 (0: any)")
    parser.add_argument(
        "--serve",
        action="append",
        default=[],
        metavar="NAME=FOLDER",
        help="also deploy the model saved in FOLDER under NAME (repeatable)",
    )
    args = parser.parse_args(argv)
    if args.action == "stop":
        stop_from_state(args.state)
        return 0
    serve = dict(item.split("=", 1) for item in args.serve)
    harness = Harness(args.state, args.venv, args.port, {k: Path(v) for k, v in serve.items()})
    try:
        harness.start()
    except (HarnessError, subprocess.SubprocessError, OSError) as exc:
        harness.stop()
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"url": harness.url, "models": harness.models, "timings": harness.timings}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
