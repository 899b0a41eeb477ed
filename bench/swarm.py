#!/usr/bin/env python3
"""Rolling upgrades on Docker Swarm under load: berth (the agent drains each replaced task)
vs a plain `docker service update` (start-first, parallelism 1), side by side, in one run.

Run: scripts/bench.sh swarm      (prints a table; cleans up after itself)
     BENCH_UPDATES=2 scripts/bench.sh swarm      (a short run)

Both sides are the same 3-task Envoy service (host network, SO_REUSEPORT, --concurrency 1, the
same rendered files as Swarm configs), upgraded berth/envoy:1.39.3 <-> 1.40.0 under wrk
keep-alive load (30 connections, 2 threads, 127.0.0.1 only), UPDATES times each, alternating:
- berth: `berth up` after the image changed in the config (engine = "swarm"; each task runs
  Envoy under `berth agent`: HEALTHCHECK = the readiness probe, drain on SIGTERM, stop grace
  period = drain window + 10 s);
- plain: the service as berth makes it without the agent (Envoy's own entrypoint, no health
  check), updated with `docker service update --image IMAGE --update-order start-first
  --update-parallelism 1 --no-resolve-image` (the CLI waits until the update converged);
- the same load window on both sides: SETTLE s of load, the update command, until the port
  serves from 3 Envoy processes again, SETTLE s more;
- failed requests = wrk socket errors + non-2xx; the outage = the longest time without a 2xx on
  any connection, the longest wait = the longest one connection waited for an answer
  (bench/gap.lua); update time = the command's wall time.

Runs on a single-node Swarm made by the tests' harness (scripts/test-swarm.sh hold 1, under
/tmp/berth-locks/swarm.lock), which leaves it afterwards. Its own label (io.berth.bench=swarm), proxies (bsw,
bswplain) and ports (21800, 21801).
"""
import os, statistics, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (run_benchmark, BASE_PORT, BERTH, HostSysctls, SYSCTL_DROPIN, bench_label, sh,  # noqa: E402
                    terminate_on_sigterm, wait_serving)
import rollout  # noqa: E402
from rollout import start_wrk, stop_wrk, children  # noqa: E402

rollout.CONNECTIONS = 30  # DESIGN's anchor was measured with 30

UPDATES = int(os.environ.get("BENCH_UPDATES", "4"))
OLD, NEW = "berth/envoy:1.39.3", "berth/envoy:1.40.0"
LABEL = bench_label("swarm")
PORT, PLAIN_PORT = BASE_PORT + 800, BASE_PORT + 801
REPLICAS = 3
SETTLE = 2.0
AGENT = BERTH        # static: berth and its own agent
PLAIN_BERTH = BERTH


def config(name, port, image, agent=True):
    """The proxy; the plain side's without the agent (`[swarm] agent = false`): Envoy's own
    entrypoint, as a plain Swarm service runs it (berth refuses a non-static agent binary)."""
    swarm = "" if agent else "\n[swarm]\nagent = false\n"
    return f"""engine = "swarm"
{swarm}
[[proxy]]
name = "{name}"
image = "{image}"
replicas = {REPLICAS}
concurrency = 1

[proxy.shutdown]
drain_timeout = "5s"
min_drain_duration = "0s"

[proxy.rollout]
startup_deadline = "20s"
min_ready = "1s"

[[proxy.listener]]
name = "web"
port = {port}
protocol = "http"

[[proxy.listener.route]]
path_prefix = "/"
direct_response = {{ status = 200, body = "{name}\\n" }}
"""


def berth_cmd(binary, cfg, state, *args):
    env = ["env", f"BERTH_SYSCTL_DROPIN={SYSCTL_DROPIN}", f"BERTH_AGENT_BINARY={AGENT}"]
    return env + [binary, "-f", cfg, "--state-dir", state, "--container-label", LABEL, *args]


def rollouts(d, name, port, update):
    """Starts the service on OLD, then UPDATES updates under load; update(image) runs one."""
    results = []
    for i in range(UPDATES):
        image = NEW if i % 2 == 0 else OLD
        wrk = start_wrk(port)
        time.sleep(SETTLE)
        t0 = time.monotonic()
        rc = update(image)
        took = time.monotonic() - t0
        wait_serving(port, REPLICAS, f"{name}\n")
        time.sleep(SETTLE)
        w = stop_wrk(wrk)
        w.update(rc=rc, took=took)
        results.append(w)
    return results


def berth_side(d):
    cfg, state = os.path.join(d, "berth.toml"), os.path.join(d, "s")

    def write(image):
        with open(cfg, "w") as f:
            f.write(config("bsw", PORT, image))
    write(OLD)
    sh(*berth_cmd(AGENT, cfg, state, "-q", "up"))
    wait_serving(PORT, REPLICAS, "bsw\n")

    def update(image):
        write(image)
        return subprocess.run(berth_cmd(AGENT, cfg, state, "-q", "up"), capture_output=True).returncode
    try:
        return rollouts(d, "bsw", PORT, update)
    finally:
        sh(*berth_cmd(AGENT, cfg, state, "-q", "down"), check=False)


def plain_side(d):
    cfg, state = os.path.join(d, "plain.toml"), os.path.join(d, "p")
    with open(cfg, "w") as f:
        f.write(config("bswplain", PLAIN_PORT, OLD, agent=False))
    sh(*berth_cmd(PLAIN_BERTH, cfg, state, "-q", "up"))
    wait_serving(PLAIN_PORT, REPLICAS, "bswplain\n")

    def update(image):
        return subprocess.run(
            ["docker", "service", "update", "--quiet", "--image", image, "--update-order", "start-first",
             "--update-parallelism", "1", "--no-resolve-image", "berth-bswplain"],
            capture_output=True).returncode
    try:
        return rollouts(d, "bswplain", PLAIN_PORT, update)
    finally:
        sh(*berth_cmd(PLAIN_BERTH, cfg, state, "-q", "down"), check=False)


def table(b, p):
    def row(label, f, fmt="{}"):
        print(f"{label:<58}{fmt.format(f(b)):>16}{fmt.format(f(p)):>22}")
    print(f"{'per update (' + str(UPDATES) + ' each side)':<58}{'berth + agent':>16}{'docker service update':>22}")
    print("-" * 96)
    row("failed requests, total", lambda r: sum(x["errors"] for x in r))
    row("failed requests, per update (max)", lambda r: max(x["errors"] for x in r))
    row("failed requests, per update (min)", lambda r: min(x["errors"] for x in r))
    row("update time (median), s", lambda r: statistics.median(x["took"] for x in r), "{:.1f}")
    row("update time (max), s", lambda r: max(x["took"] for x in r), "{:.1f}")
    row("outage: longest time without any 2xx (max), s", lambda r: max(x["outage"] for x in r), "{:.3f}")
    row("longest wait of one connection for an answer, s", lambda r: max(x["wait"] for x in r), "{:.3f}")
    row("requests served, total", lambda r: sum(x["reqs"] for x in r))
    row("update commands that failed", lambda r: sum(1 for x in r if x["rc"] != 0))


def hold_swarm():
    """A single-node Swarm from the tests' harness (scripts/test-swarm.sh hold 1: it takes
    /tmp/berth-locks/swarm.lock, sweeps a crashed run's leftovers, refuses a Swarm it did not
    make), kept until its stdin closes."""
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts/test-swarm.sh")
    holder = subprocess.Popen([script, "hold", "1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = holder.stdout.readline()
    if not line.startswith("ready "):
        holder.wait()
        raise SystemExit(f"no Swarm: scripts/test-swarm.sh hold 1 exited {holder.returncode} (its reason above)")
    return holder


def main():
    terminate_on_sigterm()
    swarm = hold_swarm()
    print(f"Rolling upgrades of a 3-task Envoy service ({OLD} <-> {NEW}) on a single-node Swarm, "
          f"under wrk load (30 keep-alive connections, 2 threads, 127.0.0.1), {UPDATES} updates each side.")
    print("Same load window on both sides (2 s, the update command, until 3 Envoy processes serve, 2 s).")
    print("Anchor (DESIGN, measured earlier here): plain updates lost 34-38 requests each, ~8.4 s per update.")
    print()
    try:
        with HostSysctls(), tempfile.TemporaryDirectory(prefix="bsw") as d:
            b = berth_side(d)
            p = plain_side(d)
            table(b, p)
    finally:
        for c in children:
            if c.poll() is None:
                c.kill()
        swarm.stdin.close()  # the harness leaves the Swarm and removes what it made
        swarm.wait()


if __name__ == "__main__":
    sys.exit(run_benchmark("swarm", main))
