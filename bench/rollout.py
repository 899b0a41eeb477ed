#!/usr/bin/env python3
"""Rolling upgrade under load: berth vs docker-compose, in one run.

Run: scripts/bench.sh rollout      (prints a table; cleans up after itself)

Both fleets are 3 Envoy replicas on one host port (host networking, SO_REUSEPORT), upgraded
1.39.3 -> 1.40.0 (and back) under wrk keep-alive load (50 connections, 2 threads).
- berth: `berth up` after the image changes in the config, ROLLOUTS times, alternating;
- compose: `docker-compose up -d` after the image changes in the compose file, ROLLOUTS times;
- failed requests = wrk socket errors + non-2xx; longest gap without a 2xx (wrk Lua, per thread);
- per-replica time: berth's replace of one slot (new container created .. old one removed),
  against the floor (`docker run` of one Envoy until /ready), measured in the same run.
"""
import os, re, signal, statistics, subprocess, sys, tempfile, time

from common import BASE_PORT, berth, cleanup, compose_project, fleet_toml, floor_run, sh, timed

ROLLOUTS = int(os.environ.get("BENCH_ROLLOUTS", "10"))
OLD, NEW = "berth/envoy:1.39.3", "berth/envoy:1.40.0"
PORT = BASE_PORT + 700
MIN_READY, DRAIN = "1s", "10s"
HERE = os.path.dirname(os.path.abspath(__file__))


def start_wrk(port):
    return subprocess.Popen(
        ["wrk", "-t2", "-c50", "-d600s", "-s", os.path.join(HERE, "gap.lua"), f"http://127.0.0.1:{port}/"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def stop_wrk(p):
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=30)
    errors = 0
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if m:
        errors += sum(int(x) for x in m.groups())
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if m:
        errors += int(m.group(1))
    reqs = re.search(r"(\d+) requests in", out)
    gap = re.search(r"MAXGAP ([\d.]+)", out)
    return errors, int(reqs.group(1)) if reqs else 0, float(gap.group(1)) if gap else float("nan")


def berth_rollouts(d, state):
    cfg = os.path.join(d, "berth.toml")
    def write(image):
        with open(cfg, "w") as f:
            f.write(fleet_toml(1, 3, PORT, min_ready=MIN_READY, image=image).replace('name = "bench0"', 'name = "roll"')
                    .replace('drain_timeout = "5s"', f'drain_timeout = "{DRAIN}"'))
    write(OLD)
    sh(*berth(cfg, state, "-q", "up"))
    time.sleep(1)
    results = []
    for i in range(ROLLOUTS):
        image = NEW if i % 2 == 0 else OLD
        write(image)
        wrk = start_wrk(PORT)
        time.sleep(2)
        t0 = time.monotonic()
        p = subprocess.Popen(berth(cfg, state, "--output", "json", "up"), stdout=subprocess.PIPE, text=True)
        per_replica, started, ready, drained = [], None, [], []
        for line in p.stdout:
            if '"event":"replacing"' in line:
                started = time.monotonic()
            elif '"event":"ready"' in line:
                m = re.search(r"in ([\d.]+)s", line)
                if m:
                    ready.append(float(m.group(1)))
            elif '"event":"drained"' in line:
                m = re.search(r"after ([\d.]+)s", line)
                if m:
                    drained.append(float(m.group(1)))
            elif '"event":"removed"' in line and started is not None:
                per_replica.append(time.monotonic() - started)
                started = None
        rc = p.wait()
        total = time.monotonic() - t0
        time.sleep(2)
        errors, reqs, gap = stop_wrk(wrk)
        results.append(dict(rc=rc, errors=errors, reqs=reqs, gap=gap, total=total, per_replica=per_replica,
                            ready=ready, drained=drained))
    sh(*berth(cfg, state, "-q", "down"))
    return results


def compose_rollouts(d):
    cdir = os.path.join(d, "compose")
    os.makedirs(cdir)
    def write(image):
        compose_project(cdir, 1, 3, PORT, image=image)
    write(OLD)
    sh("docker-compose", "-p", "berthroll", "up", "-d", cwd=cdir)
    time.sleep(3)
    results = []
    for i in range(ROLLOUTS):
        write(NEW if i % 2 == 0 else OLD)
        wrk = start_wrk(PORT)
        time.sleep(2)
        total, _ = timed("docker-compose", "-p", "berthroll", "up", "-d", cwd=cdir)
        time.sleep(4)
        errors, reqs, gap = stop_wrk(wrk)
        results.append(dict(rc=0, errors=errors, reqs=reqs, gap=gap, total=total, per_replica=[], ready=[], drained=[]))
    sh("docker-compose", "-p", "berthroll", "down", "-t", "1", cwd=cdir, check=False)
    return results


def main():
    d = tempfile.mkdtemp(prefix="berth-bench-")
    state = os.path.join(d, "state")
    try:
        floors = [floor_run(d) for _ in range(5)]
        b = berth_rollouts(d, state)
        c = compose_rollouts(d)
        med = statistics.median
        floor = med(floors)
        per = [x for r in b for x in r["per_replica"]]
        print()
        print(f"Rolling upgrade of 3 replicas under wrk load (50 keep-alive connections), {ROLLOUTS} rollouts each")
        print(f"{'':<40} {'berth':>14} {'docker-compose':>16}")
        print("-" * 72)
        print(f"{'failed requests, total':<40} {sum(r['errors'] for r in b):>14} {sum(r['errors'] for r in c):>16}")
        print(f"{'failed requests, worst rollout':<40} {max(r['errors'] for r in b):>14} {max(r['errors'] for r in c):>16}")
        print(f"{'requests served, total':<40} {sum(r['reqs'] for r in b):>14} {sum(r['reqs'] for r in c):>16}")
        print(f"{'longest gap without a 2xx (max)':<40} {max(r['gap'] for r in b):>13.3f}s {max(r['gap'] for r in c):>15.3f}s")
        print(f"{'rollout time (median)':<40} {med([r['total'] for r in b]):>13.2f}s {med([r['total'] for r in c]):>15.2f}s")
        print(f"{'rollouts that failed (exit != 0)':<40} {sum(1 for r in b if r['rc'] != 0):>14} {'':>16}")
        print()
        ready = med([x for r in b for x in r["ready"]])
        drained = med([x for r in b for x in r["drained"]])
        min_ready = float(MIN_READY.rstrip("s"))
        per_med = med(per) if per else float("nan")
        rest = per_med - ready - min_ready - drained
        goal = 1.2 * floor + min_ready + drained
        print(f"per-replica replace time (berth, median of {len(per)}): {per_med:.2f}s")
        print(f"  = create+start+ready {ready:.2f}s + min_ready {min_ready:.2f}s + drain {drained:.2f}s"
              f" (until 0 connections; min_drain_duration 0s, drain_timeout {DRAIN}) + stop/remove/poll {rest:.2f}s")
        print(f"floor (docker run of 1 hardened Envoy until /ready, median of {len(floors)}): {floor:.2f}s;"
              f" create+start+ready / floor = {ready / floor:.2f}x")
        print(f"goal: per-replica <= 1.2 x floor + min_ready + drain = {goal:.2f}s -> {'met' if per_med <= goal else 'NOT met'}")
    finally:
        cleanup(d, state)


if __name__ == "__main__":
    sys.exit(main())
