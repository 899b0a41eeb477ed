"""Shared helpers for the benchmarks: run commands, write configs, measure the floor, clean up.

Isolation: every benchmark passes its own label (`io.berth.bench=<name>`), its own proxy-name
prefix, its own compose project name, its own ports and its own temporary directories, so two
benchmarks (or a benchmark and the test suite, which uses `io.berth.test=1`) never touch each
other's containers.
"""
import datetime, json, os, platform, re, shutil, signal, socket, subprocess, sys, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Every build of berth targets the host's triple explicitly (.cargo/config.toml: static linking).
HOST_TRIPLE = re.search(r"^host: (\S+)", subprocess.run(["rustc", "-vV"], capture_output=True, text=True).stdout,
                        re.M).group(1)
BERTH = os.environ.get("BERTH_BIN", os.path.join(ROOT, "target", HOST_TRIPLE, "release/berth"))
IMAGE = "berth/envoy:1.40.0"
BASE_PORT = 21000


def bench_label(name):
    return f"io.berth.bench={name}"


def sh(*args, check=True, **kw):
    r = subprocess.run(list(args), check=False, capture_output=True, text=True, **kw)
    if check and r.returncode != 0:
        sys.stderr.write(f"command failed (exit {r.returncode}): {' '.join(args)}\n{r.stdout}{r.stderr}\n")
        raise subprocess.CalledProcessError(r.returncode, args, r.stdout, r.stderr)
    return r


def timed(*args, **kw):
    t = time.monotonic()
    r = sh(*args, **kw)
    return time.monotonic() - t, r


def terminate_on_sigterm():
    """SIGTERM raises SystemExit, so `finally:` blocks (the cleanup) run as they do on Ctrl-C."""
    def handler(signum, frame):
        raise SystemExit(f"terminated by signal {signum}")
    signal.signal(signal.SIGTERM, handler)


# berth tunes the host as root (tcp_migrate_req, inotify instances for 100 replicas): its
# drop-in goes here, never to /etc/sysctl.d, and `HostSysctls` puts the values back at the end.
SYSCTL_DROPIN = "/tmp/berth-bench-sysctl.d/60-berth.conf"
SYSCTLS = ("net/ipv4/tcp_migrate_req", "net/ipv4/ip_unprivileged_port_start",
           "fs/inotify/max_user_instances", "fs/inotify/max_user_watches")


os.environ["BERTH_SYSCTL_DROPIN"] = SYSCTL_DROPIN


def berth(cfg, state, label, *args):
    """berth itself, as a user types it (no `env` in front: its exec would count as berth's)."""
    return [BERTH, "-f", cfg, "--state-dir", state, "--container-label", label, *args]


class HostSysctls:
    """Restores the kernel settings berth may raise, as a benchmark found them."""

    def __enter__(self):
        self.saved = {}
        for k in SYSCTLS:
            try:
                with open(f"/proc/sys/{k}") as f:
                    self.saved[k] = f.read().strip()
            except OSError:
                pass
        return self

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            try:
                with open(f"/proc/sys/{k}", "w") as f:
                    f.write(v)
            except OSError as e:
                sys.stderr.write(f"could not restore {k}={v}: {e}\n")
        shutil.rmtree(os.path.dirname(SYSCTL_DROPIN), ignore_errors=True)
        return False


def container_ids(label):
    """The IDs of every container carrying the label (running or not), sorted."""
    return sorted(sh("docker", "ps", "-aq", "--no-trunc", "--filter", f"label={label}").stdout.split())


DOCKER_SOCKET = "/var/run/docker.sock"


def floor_list():
    """The physical floor of a no-op: seconds for a fresh process (curl) to get one answer to
    GET /containers/json from the Docker daemon on this machine."""
    t, _ = timed("curl", "-sS", "-o", "/dev/null", "--unix-socket", DOCKER_SOCKET,
                 "http://localhost/containers/json")
    return t


# Envoy's worker threads per replica, pinned equally on both sides of every comparison (berth's
# `concurrency`, compose's `--concurrency`).
CONCURRENCY = 1


def fleet_toml(n_proxies, replicas, base_port, prefix, min_ready="2s", image=IMAGE, drain_timeout="5s",
               max_surge=None, min_drain_duration="0s"):
    """n proxies named <prefix>0.., each `replicas` replicas on port base_port+i, answering
    200 "<name>\\n" to every request. max_surge: None for berth's default, else 2 or "50%"."""
    out = []
    surge = "" if max_surge is None else f"\nmax_surge = {json.dumps(max_surge)}"
    for i in range(n_proxies):
        name = f"{prefix}{i}"
        out.append(f"""
[[proxy]]
name = "{name}"
image = "{image}"
replicas = {replicas}
concurrency = {CONCURRENCY}
[proxy.rollout]
min_ready = "{min_ready}"{surge}
[proxy.shutdown]
drain_timeout = "{drain_timeout}"
min_drain_duration = "{min_drain_duration}"
[[proxy.listener]]
name = "web"
port = {base_port + i}
protocol = "http"
[[proxy.listener.route]]
path_prefix = "/"
direct_response = {{ status = 200, body = "{name}\\n" }}
""")
    return "".join(out)


BOOTSTRAP = """admin:
  address: {{pipe: {{path: /tmp/admin.sock, mode: 384}}}}
static_resources:
  listeners:
  - name: web
    address: {{socket_address: {{address: 0.0.0.0, port_value: {port}}}}}
    enable_reuse_port: true
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: web
          route_config:
            virtual_hosts: [{{name: all, domains: ["*"], routes: [{{match: {{prefix: /}}, direct_response: {{status: 200, body: {{inline_string: "compose\\n"}}}}}}]}}]
          http_filters: [{{name: envoy.filters.http.router, typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}}}]
"""


def compose_project(d, n, replicas, base_port, label, image=IMAGE):
    """A compose file in d: n services envoy0.. of `replicas` each on port base_port+i, hardened
    like berth's replicas. The image is FROM scratch, so the admin socket needs the writable
    /tmp tmpfs (read-only root filesystem)."""
    services = []
    for i in range(n):
        path = os.path.join(d, f"bootstrap{i}.yaml")
        with open(path, "w") as f:
            f.write(BOOTSTRAP.format(port=base_port + i))
        os.chmod(path, 0o644)
        services.append(f"""  envoy{i}:
    image: {image}
    network_mode: host
    scale: {replicas}
    restart: unless-stopped
    labels: ["{label}"]
    user: "101:101"
    read_only: true
    cap_drop: [ALL]
    security_opt: ["no-new-privileges:true"]
    tmpfs: ["/tmp:mode=1777"]
    volumes: ["{path}:/etc/envoy/bootstrap.yaml:ro"]
    command: ["-c", "/etc/envoy/bootstrap.yaml", "--disable-hot-restart", "--concurrency", "{CONCURRENCY}"]
""")
    with open(os.path.join(d, "docker-compose.yml"), "w") as f:
        f.write('version: "2.4"\nservices:\n' + "".join(services))


def compose(cdir, project, *args, **kw):
    return sh("docker-compose", "-p", project, *args, cwd=cdir, **kw)


def _http(sock, path, host):
    """One HTTP/1.1 GET on a connected socket: (status, body), chunked bodies decoded. Reads
    only as far as the answer goes (Envoy may hold the connection open after it, e.g. for its
    delayed close)."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    data = b""

    def more():
        nonlocal data
        chunk = sock.recv(65536)
        data += chunk
        return bool(chunk)
    while b"\r\n\r\n" not in data:
        if not more():
            raise ValueError("connection closed before the headers")
    head, _, _ = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = dict((k.strip().lower(), v.strip()) for k, _, v in (l.partition(":") for l in lines[1:]))
    start = len(head) + 4
    if headers.get("transfer-encoding", "").lower() == "chunked":
        out, pos = b"", start
        while True:
            while b"\r\n" not in data[pos:]:
                if not more():
                    raise ValueError("connection closed inside a chunk")
            size_line, _, _ = data[pos:].partition(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            pos += len(size_line) + 2
            if size == 0:
                break
            while len(data) < pos + size + 2:
                if not more():
                    raise ValueError("connection closed inside a chunk")
            out += data[pos:pos + size]
            pos += size + 2
        body = out
    elif "content-length" in headers:
        n = int(headers["content-length"])
        while len(data) < start + n:
            if not more():
                raise ValueError("connection closed inside the body")
        body = data[start:start + n]
    else:
        while more():
            pass
        body = data[start:]
    return status, body.decode(errors="replace")


def unix_get(sock, path, timeout=1.0):
    """GET over a Unix socket (an Envoy admin socket); the body, or None."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(sock)
            return _http(s, path, "admin")[1]
    except (OSError, IndexError, ValueError):
        return None


def http_get(port, path="/", timeout=2.0):
    """(status, body) of one GET to 127.0.0.1:port, or (None, error)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            return _http(s, path, "127.0.0.1")
    except (OSError, IndexError, ValueError) as e:
        return None, str(e)


def wait_ready_socket(sock, deadline=30):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if (unix_get(sock, "/ready") or "").strip() == "LIVE":
            return True
        time.sleep(0.005)
    return False


def floor_run(d, port, label):
    """Seconds from `docker run` of one Envoy until its /ready is LIVE, run as berth runs a
    replica (host network, user 101, read-only root, no capabilities, no-new-privileges,
    restart unless-stopped, a run directory for the admin socket, one worker)."""
    run = os.path.join(d, "floor-run")
    os.makedirs(run, exist_ok=True)
    os.chmod(run, 0o777)
    sock = os.path.join(run, "admin.sock")
    if os.path.exists(sock):
        os.remove(sock)  # the previous run's
    path = os.path.join(d, "floor.yaml")
    with open(path, "w") as f:
        f.write(BOOTSTRAP.format(port=port).replace("/tmp/admin.sock", "/run/berth/admin.sock"))
    os.chmod(path, 0o644)
    t = time.monotonic()
    cid = sh("docker", "run", "-d", "--label", label, "--network", "host", "--user", "101:101",
             "--restart", "unless-stopped", "--read-only", "--cap-drop", "ALL",
             "--security-opt", "no-new-privileges:true",
             "-v", f"{path}:/etc/envoy/bootstrap.yaml:ro", "-v", f"{run}:/run/berth",
             IMAGE, "-c", "/etc/envoy/bootstrap.yaml", "--disable-hot-restart", "--concurrency", str(CONCURRENCY)).stdout.strip()
    ok = wait_ready_socket(sock)
    elapsed = time.monotonic() - t
    sh("docker", "rm", "-f", cid, check=False)
    if not ok:
        raise SystemExit(f"floor: the Envoy container {cid[:12]} never reported LIVE")
    return elapsed


def running(label_filter):
    """How many containers matching a label filter are running."""
    return len(sh("docker", "ps", "-q", "--filter", f"label={label_filter}", check=False).stdout.split())


def listener_pids(port):
    """The processes with a TCP socket listening on port (one per Envoy, whatever its workers)."""
    out = sh("ss", "-Hltnp", f"sport = :{port}", check=False).stdout
    return set(re.findall(r"pid=(\d+)", out))


def wait_serving(port, n, body=None, deadline=60):
    """Until exactly n processes listen on 127.0.0.1:port and a GET answers 200 (with `body`
    if given). Raises when that does not happen within the deadline."""
    end = time.monotonic() + deadline
    last = None
    while time.monotonic() < end:
        pids = listener_pids(port)
        status, text = http_get(port)
        last = (len(pids), status, text.strip()[:80])
        if len(pids) == n and status == 200 and (body is None or text == body):
            return
        time.sleep(0.1)
    raise SystemExit(f"port {port} never served from {n} processes; last: {last[0]} listening, "
                     f"status {last[1]}, body {last[2]!r}")


def remove_labelled(label):
    ids = sh("docker", "ps", "-aq", "--filter", f"label={label}", check=False).stdout.split()
    if ids:
        sh("docker", "rm", "-f", *ids, check=False)
    return len(ids)


def cleanup(label, dirs=(), compose_dir=None, project=None):
    """Removes this benchmark's containers (its label only), its compose project and its
    directories (state included)."""
    if compose_dir and project and os.path.exists(os.path.join(compose_dir, "docker-compose.yml")):
        compose(compose_dir, project, "down", "-t", "1", check=False)
    remove_labelled(label)
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


def _first_line(args, any_status=False):
    """The first line a tool prints (`wrk -v` exits 1), or "not installed"."""
    try:
        r = subprocess.run(args, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return "not installed"
    out = (r.stdout or r.stderr).strip().splitlines()
    return out[0] if (r.returncode == 0 or any_status) and out else "not installed"


def _load():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def header(name):
    """The facts a result is read with: what ran (commit, whether the tree differed from it),
    the tools' versions, the host and its load average at the start."""
    git = lambda *a: subprocess.run(["git", "-C", ROOT, *a], capture_output=True, text=True)
    commit = git("rev-parse", "HEAD").stdout.strip() or "unknown"
    dirty = git("diff", "--quiet", "HEAD", "--", "src", "templates", "bench", "scripts", "Cargo.toml",
                "Cargo.lock", ":!bench/results").returncode != 0
    envoy = []
    for v in ("1.39.3", "1.40.0"):
        out = _first_line(["docker", "run", "--rm", "--network", "none", f"berth/envoy:{v}", "--version"])
        m = re.search(r"version: (\S+)", out)
        envoy.append(f"berth/envoy:{v} {m.group(1) if m else out}")
    with open("/proc/meminfo") as f:
        mem = int(re.search(r"MemTotal:\s+(\d+)", f.read()).group(1)) / 1048576
    rows = [
        ("date", datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")),
        ("commit", commit + (" (with uncommitted changes)" if dirty else "")),
        ("berth", f"{_first_line([BERTH, '--version'])} ({BERTH})"),
        ("docker", _first_line(["docker", "version", "--format",
                                "engine {{.Server.Version}}, client {{.Client.Version}}"])),
        ("docker-compose", f"{_first_line(['docker-compose', 'version', '--short'])} "
                           f"(Debian package, Python {platform.python_version()})"),
        ("wrk", " ".join(_first_line(["wrk", "-v"], any_status=True).split()[:2])),
        ("envoy", "; ".join(envoy)),
        ("host", f"{platform.system()} {platform.release()}, {os.cpu_count()} cores, {mem:.0f} GiB"),
        ("load", f"{_load()} (1/5/15-minute load average at the start)"),
    ]
    print(f"# scripts/bench.sh {name}")
    for k, v in rows:
        print(f"{k + ':':<16}{v}")
    print("note:           one modest run; other work on the host adds noise: compare the two sides")
    print("                of one run, not runs with each other.")
    print()
    sys.stdout.flush()


def run_benchmark(name, main):
    """Runs a benchmark's main() between its header and a footer with the load average at the
    end and the wall time: scripts/bench.sh writes what this prints to bench/results/NAME.txt,
    and nothing else writes there."""
    header(name)
    t0 = time.monotonic()
    rc = main()
    print()
    print(f"{'load:':<16}{_load()} (1/5/15-minute load average at the end)")
    print(f"{'took:':<16}{time.monotonic() - t0:.0f} s")
    return rc
