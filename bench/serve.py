"""berth serve: drift repair latency, live route update latency, idle memory with 10 x 3 replicas.

One run, one table. Uses the release binary (scripts/bench.sh builds it) and cleans up after itself.
"""
import json, os, shutil, signal, socket, statistics, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (run_benchmark, BERTH, CONCURRENCY, IMAGE, SYSCTL_DROPIN, HostSysctls, fleet_toml, sh,  # noqa: E402
                    terminate_on_sigterm)

# Its own label, proxy names (sv0..sv9) and ports: other benchmarks use io.berth.bench=noop|rollout.
LABEL = "io.berth.bench=serve"

PROXIES, REPLICAS = 10, 3
BASE = 23100
STATUS_PORT = 23099
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))  # drift repairs and route updates each


def unix_get(sock, path, timeout=1.0):
    """HTTP/1.1 GET over a Unix socket; the body, or None."""
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        s.connect(sock)
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        s.close()
        return data.split(b"\r\n\r\n", 1)[1].decode()
    except OSError:
        return None


def tcp_get(port, path):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=2)
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        s.close()
        return data.decode()
    except OSError:
        return ""


def status():
    body = tcp_get(STATUS_PORT, "/status")
    try:
        return json.loads(body.split("\r\n\r\n", 1)[1])
    except (IndexError, ValueError):
        return None


def converged(st):
    if not st or len(st["proxies"]) != PROXIES:
        return False
    for p in st["proxies"]:
        g = p["desiredGeneration"]
        reps = p["replicas"]
        if p["busy"] or len(reps) != REPLICAS:
            return False
        if any(r["ready"] is not True or r["observedGeneration"] != g for r in reps):
            return False
    return True


def wait(pred, deadline, what):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {what}")


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def cleanup(d, state):
    ids = sh("docker", "ps", "-aq", "--filter", f"label={LABEL}", check=False).stdout.split()
    if ids:
        sh("docker", "rm", "-f", *ids, check=False)
    shutil.rmtree(state, ignore_errors=True)
    shutil.rmtree(d, ignore_errors=True)


def fleet(body0="sv0\\n"):
    """The fleet, with proxy names of its own (sv0..sv9; other benchmarks use nb*, nf*, rb*)."""
    text = fleet_toml(PROXIES, REPLICAS, BASE, "sv", min_ready="0s")
    return text.replace('body = "sv0\\n"', f'body = "{body0}"')


def write_config(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.rename(tmp, path)


def main():
    terminate_on_sigterm()
    d = tempfile.mkdtemp(prefix="bsv")
    state = tempfile.mkdtemp(prefix="bss", dir="/tmp")
    cfg = os.path.join(d, "berth.toml")
    write_config(cfg, fleet())
    log = open(os.path.join(d, "serve.log"), "w")
    sysctls = HostSysctls().__enter__()  # before serve, which tunes the host first thing
    serve = subprocess.Popen(
        [BERTH, "-f", cfg, "--state-dir", state, "--container-label", LABEL, "serve",
         "--listen", f"127.0.0.1:{STATUS_PORT}", "--resync", "30s"],
        stdout=subprocess.DEVNULL, stderr=log, env={**os.environ, "BERTH_SYSCTL_DROPIN": SYSCTL_DROPIN})
    rows = []
    try:
        t = time.monotonic()
        wait(lambda: converged(status()) or serve.poll() is not None, 300, f"{PROXIES}x{REPLICAS} replicas")
        if serve.poll() is not None:
            raise SystemExit(f"berth serve exited {serve.returncode}")
        start_all = time.monotonic() - t

        # Idle memory: nothing to do but the event stream and the resync timer.
        time.sleep(5)
        idle_kib = rss_kib(serve.pid)

        # Drift repair: docker rm -f one replica; until its replacement reports LIVE.
        run_dir = os.path.join(state, "proxies", "sv0", "run")
        drift = []
        for i in range(ROUNDS):
            names = sh("docker", "ps", "--filter", f"label={LABEL}", "--filter", "label=io.berth.proxy=sv0",
                       "--format", "{{.Names}}").stdout.split()
            victim = sorted(names)[i % len(names)]
            t0 = time.time()
            m0 = time.monotonic()
            sh("docker", "rm", "-f", victim)
            # The replacement may get the same name (and run directory): wait for an admin
            # socket created after the removal that reports LIVE.
            while True:
                fresh = []
                for n in os.listdir(run_dir):
                    sock = os.path.join(run_dir, n, "admin.sock")
                    try:
                        if os.stat(sock).st_ctime >= t0:
                            fresh.append(sock)
                    except OSError:
                        pass
                if any("LIVE" in (unix_get(s, "/ready") or "") for s in fresh):
                    break
                if time.monotonic() - m0 > 30:
                    raise SystemExit("no replacement within 30s")
                time.sleep(0.005)
            t0 = m0
            drift.append(time.monotonic() - t0)
            wait(lambda: converged(status()), 60, "converged after drift")

        # Route update: a new body for bench0; until every replica accepted the new generation
        # and the port serves it.
        route = []
        for i in range(ROUNDS):
            st = status()
            p = next(p for p in st["proxies"] if p["name"] == "sv0")
            want = str(p["desiredGeneration"] + 1)
            socks = [os.path.join(run_dir, r["container"], "admin.sock") for r in p["replicas"]]
            text = fleet(f"bench0 round {i}\\n")
            t0 = time.monotonic()
            write_config(cfg, text)
            pending = set(socks)
            while pending:
                for s in list(pending):
                    body = unix_get(s, "/stats?filter=%5Ehttp%5C.web%5C.rds%5C.web%5C.version_text%24")
                    if body and f'"{want}"' in body:
                        pending.discard(s)
                if time.monotonic() - t0 > 10:
                    raise SystemExit(f"route update not confirmed: {pending}")
                time.sleep(0.002)
            route.append(time.monotonic() - t0)
            assert f"bench0 round {i}" in tcp_get(BASE, "/"), "new body not served"
            wait(lambda: converged(status()), 30, "converged after route update")

        scrape_t = time.monotonic()
        metrics = tcp_get(STATUS_PORT, "/metrics")
        scrape = time.monotonic() - scrape_t
        after_kib = rss_kib(serve.pid)

        ms = lambda v: f"{v * 1000:.0f} ms"
        rows = [
            ("converge 10 proxies x 3 replicas from nothing", f"{start_all:.1f} s", ""),
            ("drift repair, docker rm -f -> ready replacement (median / max of %d)" % ROUNDS,
             f"{ms(statistics.median(drift))} / {ms(max(drift))}", "[< 1.5 s]"),
            ("route update, file written -> all 3 replicas serve it (median / max of %d)" % ROUNDS,
             f"{ms(statistics.median(route))} / {ms(max(route))}", "[< 500 ms]"),
            ("serve resident memory, idle, 10 x 3 replicas (VmRSS)", f"{idle_kib / 1024:.1f} MiB", "[< 30 MiB]"),
            ("serve resident memory after the rounds and a /metrics scrape", f"{after_kib / 1024:.1f} MiB", ""),
            ("/metrics scrape (30 replicas, %d lines)" % metrics.count("\n"), ms(scrape), ""),
        ]
    except BaseException:
        log.flush()
        with open(os.path.join(d, "serve.log")) as f:
            sys.stderr.write("serve log (last lines):\n" + "".join(f.readlines()[-25:]))
        raise
    finally:
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(timeout=60)
        except subprocess.TimeoutExpired:
            serve.kill()
        log.close()
        cleanup(d, state)
        sysctls.__exit__(None, None, None)
    w = max(len(r[0]) for r in rows)
    print(f"\nberth serve ({IMAGE}, {PROXIES} proxies x {REPLICAS} replicas, Envoy --concurrency {CONCURRENCY})")
    print("No baseline: docker-compose has no manager that repairs drift or updates routes live.\n")
    print(f"{'measure':<{w}}  {'result':>18}  goal")
    for name, value, goal in rows:
        print(f"{name:<{w}}  {value:>18}  {goal}")


if __name__ == "__main__":
    sys.exit(run_benchmark("serve", main))
