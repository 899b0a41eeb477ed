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

from common import BASE_PORT, berth, cleanup, compose_project, fleet_toml, floor_run, sh, timed

RUNS = int(os.environ.get("BENCH_RUNS", "5"))


def main():
    d = tempfile.mkdtemp(prefix="berth-bench-")
    state = os.path.join(d, "state")
    rows = []
    try:
        # berth fleet
        cfg = os.path.join(d, "fleet.toml")
        with open(cfg, "w") as f:
            f.write(fleet_toml(10, 3, BASE_PORT, min_ready="0s"))
        t_fresh_fleet, _ = timed(*berth(cfg, state, "-q", "up"))
        noops, calls = [], []
        for _ in range(RUNS):
            t, r = timed(*berth(cfg, state, "--output", "json", "up"))
            noops.append(t)
            events = [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]
            summary = [e for e in events if e.get("event") == "summary"]
            if summary:
                calls.append(int(summary[-1].get("message", "0").split()[0]))
        sh(*berth(cfg, state, "-q", "down"))

        # compose fleet
        cdir = os.path.join(d, "compose")
        os.makedirs(cdir)
        compose_project(cdir, 10, 3, BASE_PORT + 100)
        t_fresh_compose, _ = timed("docker-compose", "-p", "berthbench", "up", "-d", cwd=cdir)
        cnoops = [timed("docker-compose", "-p", "berthbench", "up", "-d", cwd=cdir)[0] for _ in range(RUNS)]
        sh("docker-compose", "-p", "berthbench", "down", "-t", "1", cwd=cdir, check=False)

        # fresh up of one proxy x3 vs the floor
        one = os.path.join(d, "one.toml")
        with open(one, "w") as f:
            f.write(fleet_toml(1, 3, BASE_PORT + 300, min_ready="0s"))
        fresh = []
        floors = []
        for _ in range(3):
            floors.append(floor_run(d))
            t, _ = timed(*berth(one, state, "-q", "up"))
            fresh.append(t)
            sh(*berth(one, state, "-q", "down"))

        med = statistics.median
        b, c = med(noops), med(cnoops)
        print()
        print(f"{'measure':<52} {'berth':>10} {'compose':>10} {'ratio':>8}")
        print("-" * 84)
        print(f"{'no-op up, 10 proxies x 3 replicas (median of %d)' % RUNS:<52} {b:>9.3f}s {c:>9.3f}s {c / b:>7.1f}x")
        print(f"{'fresh up, 10 proxies x 3 replicas':<52} {t_fresh_fleet:>9.2f}s {t_fresh_compose:>9.2f}s {'':>8}")
        print(f"{'Docker API requests per no-op up (berth)':<52} {med(calls) if calls else float('nan'):>10.0f}")
        f3, fl = med(fresh), med(floors)
        print(f"{'fresh up, 1 proxy x 3 replicas (median of 3)':<52} {f3:>9.2f}s")
        print(f"{'floor: docker run 1 Envoy until /ready (median of 3)':<52} {fl:>9.2f}s")
        print(f"{'fresh up per replica / floor':<52} {f3 / 3 / fl:>9.2f}x")
    finally:
        cleanup(d, state)


if __name__ == "__main__":
    sys.exit(main())
