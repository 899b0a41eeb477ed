"""Shared helpers for the benchmarks: run commands, write configs, measure the floor, clean up."""
import json, os, shutil, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BERTH = os.environ.get("BERTH_BIN", os.path.join(ROOT, "target/release/berth"))
IMAGE = "berth/envoy:1.40.0"
LABEL = "io.berth.bench=1"
BASE_PORT = 21000


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


def berth(cfg, state, *args):
    return ["env", f"BERTH_STATE_DIR={state}", BERTH, "-f", cfg, "--container-label", LABEL, *args]


def fleet_toml(n_proxies, replicas, base_port, min_ready="2s", image=IMAGE):
    out = []
    for i in range(n_proxies):
        out.append(f"""
[[proxy]]
name = "bench{i}"
image = "{image}"
replicas = {replicas}
[proxy.rollout]
min_ready = "{min_ready}"
drain_timeout = "5s"
[proxy.shutdown]
min_drain_duration = "0s"
[[proxy.listener]]
name = "web"
port = {base_port + i}
protocol = "http"
[[proxy.listener.route]]
path_prefix = "/"
direct_response = {{ status = 200, body = "bench{i}\\n" }}
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


def compose_project(d, n, replicas, base_port, image=IMAGE):
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
    labels: ["io.berth.bench=1"]
    user: "101:101"
    read_only: true
    cap_drop: [ALL]
    security_opt: ["no-new-privileges:true"]
    tmpfs: ["/tmp:mode=1777"]
    volumes: ["{path}:/etc/envoy/bootstrap.yaml:ro"]
    command: ["-c", "/etc/envoy/bootstrap.yaml", "--disable-hot-restart", "--concurrency", "1"]
""")
    with open(os.path.join(d, "docker-compose.yml"), "w") as f:
        f.write('version: "2.4"\nservices:\n' + "".join(services))


def wait_ready_socket(sock, deadline=30):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        r = sh("curl", "-s", "--unix-socket", sock, "http://admin/ready", check=False)
        if r.stdout.strip() == "LIVE":
            return True
        time.sleep(0.01)
    return False


def floor_run(d):
    """docker run of one Envoy until /ready is LIVE, as berth would run it (hardened)."""
    run = os.path.join(d, "floor-run")
    os.makedirs(run, exist_ok=True)
    os.chmod(run, 0o777)
    if os.path.exists(os.path.join(run, "admin.sock")):
        os.remove(os.path.join(run, "admin.sock"))  # the previous run's
    path = os.path.join(d, "floor.yaml")
    with open(path, "w") as f:
        f.write(BOOTSTRAP.format(port=BASE_PORT + 500).replace("/tmp/admin.sock", "/run/berth/admin.sock"))
    os.chmod(path, 0o644)
    t = time.monotonic()
    cid = sh("docker", "run", "-d", "--label", LABEL, "--network", "host", "--read-only",
             "--cap-drop", "ALL", "--security-opt", "no-new-privileges:true",
             "-v", f"{path}:/etc/envoy/bootstrap.yaml:ro", "-v", f"{run}:/run/berth",
             IMAGE, "-c", "/etc/envoy/bootstrap.yaml", "--disable-hot-restart", "--concurrency", "1").stdout.strip()
    ok = wait_ready_socket(os.path.join(run, "admin.sock"))
    elapsed = time.monotonic() - t
    sh("docker", "rm", "-f", cid, check=False)
    return elapsed if ok else float("nan")


def running(label_filter):
    """How many containers matching a label filter are running."""
    return len(sh("docker", "ps", "-q", "--filter", f"label={label_filter}", check=False).stdout.split())


def cleanup(d, state, compose_dir=None):
    if compose_dir and os.path.exists(os.path.join(compose_dir, "docker-compose.yml")):
        sh("docker-compose", "-p", "berthbench", "down", "-t", "1", cwd=compose_dir, check=False)
    ids = sh("docker", "ps", "-aq", "--filter", f"label={LABEL}", check=False).stdout.split()
    if ids:
        sh("docker", "rm", "-f", *ids, check=False)
    shutil.rmtree(state, ignore_errors=True)
    shutil.rmtree(d, ignore_errors=True)


