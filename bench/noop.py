#!/usr/bin/env python3
"""No-op reconcile: berth vs docker-compose on equal fleets, plus a fresh `up` against the floor.

Run: scripts/bench.sh noop      (prints a table; cleans up after itself)

- fleet: 10 proxies x 3 replicas (berth) and a compose file with the same 30 containers
  (10 services x scale 3, host networking, same image and bootstrap shape);
- no-op: `berth up` and `docker-compose up -d` on the converged fleet, median of N runs;
- Docker API requests berth makes per no-op reconcile (berth's own count);
- fresh `up` of one proxy with 3 replicas (min_ready 0s) against the floor: `docker run` of
  one Envoy container until /ready answers LIVE on its admin socket.
"""
import json, os, statistics, sys, tempfile

from common import BASE_PORT, berth, cleanup, compose_project, fleet_toml, floor_run, running, sh, timed

RUNS = int(os.environ.get("BENCH_RUNS", "5"))
PROXIES, REPLICAS = 10, 3


def api_requests(stdout):
    """The count in `berth --output json up`'s final summary event."""
    events = [json.loads(l) for l in stdout.splitlines() if l.startswith("{")]
    summary = [e for e in events if e.get("event") == "summary"]
    if not summary:
        raise SystemExit(f"no summary event in berth's output:\n{stdout}")
    return int(summary[-1]["message"].split()[0])


def main():
    d = tempfile.mkdtemp(prefix="bb-", dir="/tmp")
    state = os.path.join(d, "state")
    cdir = os.path.join(d, "compose")
    n = PROXIES * REPLICAS
    try:
        # berth fleet
        cfg = os.path.join(d, "fleet.toml")
        with open(cfg, "w") as f:
            f.write(fleet_toml(PROXIES, REPLICAS, BASE_PORT, min_ready="0s"))
        t_fresh_fleet, _ = timed(*berth(cfg, state, "-q", "up"))
        assert running("io.berth.bench=1") == n, f"berth runs {running('io.berth.bench=1')} of {n}"
        noops, calls = [], []
        for _ in range(RUNS):
            t, r = timed(*berth(cfg, state, "--output", "json", "up"))
            noops.append(t)
            calls.append(api_requests(r.stdout))
            changed = [l for l in r.stdout.splitlines() if '"summary"' not in l]
            assert not changed, f"a no-op up acted: {changed}"
        t_down_fleet, _ = timed(*berth(cfg, state, "-q", "down"))
        assert running("io.berth.bench=1") == 0

        # compose fleet: the same 30 containers
        os.makedirs(cdir)
        compose_project(cdir, PROXIES, REPLICAS, BASE_PORT + 100)
        t_fresh_compose, _ = timed("docker-compose", "-p", "berthbench", "up", "-d", cwd=cdir)
        assert running("io.berth.bench=1") == n, f"compose runs {running('io.berth.bench=1')} of {n}"
        cnoops = [timed("docker-compose", "-p", "berthbench", "up", "-d", cwd=cdir)[0] for _ in range(RUNS)]
        t_down_compose, _ = timed("docker-compose", "-p", "berthbench", "down", "-t", "1", cwd=cdir)

        # fresh up of one proxy x3 vs the floor
        one = os.path.join(d, "one.toml")
        with open(one, "w") as f:
            f.write(fleet_toml(1, REPLICAS, BASE_PORT + 300, min_ready="0s"))
        fresh, floors = [], []
        for _ in range(3):
            floors.append(floor_run(d))
            t, _ = timed(*berth(one, state, "-q", "up"))
            fresh.append(t)
            sh(*berth(one, state, "-q", "down"))

        med = statistics.median
        b, c = med(noops), med(cnoops)
        f3, fl = med(fresh), med(floors)
        w = 58
        print()
        print(f"{'measure':<{w}} {'berth':>10} {'compose':>10} {'ratio':>8}")
        print("-" * (w + 31))
        print(f"{'no-op up, %d proxies x %d replicas (median of %d)' % (PROXIES, REPLICAS, RUNS):<{w}} {b:>9.3f}s {c:>9.3f}s {c / b:>7.1f}x")
        print(f"{'fresh up, %d proxies x %d replicas' % (PROXIES, REPLICAS):<{w}} {t_fresh_fleet:>9.2f}s {t_fresh_compose:>9.2f}s")
        print(f"{'down, %d proxies x %d replicas' % (PROXIES, REPLICAS):<{w}} {t_down_fleet:>9.2f}s {t_down_compose:>9.2f}s")
        print(f"{'Docker API requests per no-op up (berth, median)':<{w}} {med(calls):>10.0f}")
        print(f"{'  = version + 1 list + 1 inspect per container (%d)' % n:<{w}} {2 + n:>10}")
        print(f"{'fresh up, 1 proxy x %d replicas (median of 3)' % REPLICAS:<{w}} {f3:>9.2f}s")
        print(f"{'floor: docker run 1 Envoy until /ready (median of 3)':<{w}} {fl:>9.2f}s")
        print(f"{'fresh up / floor (%d replicas, one at a time, + validate)' % REPLICAS:<{w}} {f3 / fl:>9.2f}x")
        print(f"{'fresh up per replica / floor':<{w}} {f3 / REPLICAS / fl:>9.2f}x")
    finally:
        cleanup(d, state, cdir)


if __name__ == "__main__":
    sys.exit(main())
