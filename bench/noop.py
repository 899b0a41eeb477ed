#!/usr/bin/env python3
"""No-op reconcile: berth vs docker-compose on equal fleets, plus a fresh `up` against the floor.

Run: scripts/bench.sh noop      (prints a table; cleans up after itself)

- fleet: 10 proxies x 3 replicas (berth) and a compose file with the same 30 containers
  (10 services x scale 3, host networking, same image and bootstrap shape);
- no-op: `berth up` and `docker-compose up -d` on the converged fleet, median of N runs;
- Docker API requests berth makes per no-op reconcile (berth's own count);
- fresh `up` of one proxy with 3 replicas (min_ready 0s) against the floor: `docker run` of
  one Envoy container until /ready answers LIVE on its admin socket.

Its own label (io.berth.bench=noop), proxy names (nb0..nb9, nf0), compose project (bbnoop) and
ports (21000.., 21100.., 21300, 21500): it never touches another benchmark's containers.
"""
import json, os, statistics, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (BASE_PORT, bench_label, berth, cleanup, compose, compose_project, fleet_toml,  # noqa: E402
                    floor_run, remove_labelled, running, sh, terminate_on_sigterm, timed, wait_serving)

RUNS = int(os.environ.get("BENCH_RUNS", "5"))
PROXIES, REPLICAS = 10, 3
LABEL = bench_label("noop")
PROJECT = "bbnoop"
PREFIX = "nb"          # proxies nb0..nb9 (fleet) and nf0 (fresh up of one proxy)
FLEET_PORT = BASE_PORT            # 21000..21009
COMPOSE_PORT = BASE_PORT + 100    # 21100..21109
ONE_PORT = BASE_PORT + 300
FLOOR_PORT = BASE_PORT + 500


def api_requests(stdout):
    """The count in `berth --output json up`'s final summary event."""
    events = [json.loads(l) for l in stdout.splitlines() if l.startswith("{")]
    summary = [e for e in events if e.get("event") == "summary"]
    if not summary:
        raise SystemExit(f"no summary event in berth's output:\n{stdout}")
    return int(summary[-1]["message"].split()[0])


def main():
    terminate_on_sigterm()
    d = tempfile.mkdtemp(prefix="bb-noop-", dir="/tmp")
    state = tempfile.mkdtemp(prefix="bb-noop-state-", dir="/tmp")
    cdir = os.path.join(d, "compose")
    n = PROXIES * REPLICAS
    if remove_labelled(LABEL):
        sys.stderr.write(f"removed containers left by an earlier run ({LABEL})\n")
    try:
        # berth fleet
        cfg = os.path.join(d, "fleet.toml")
        with open(cfg, "w") as f:
            f.write(fleet_toml(PROXIES, REPLICAS, FLEET_PORT, PREFIX, min_ready="0s"))
        t_fresh_fleet, _ = timed(*berth(cfg, state, LABEL, "-q", "up"))
        assert running(LABEL) == n, f"berth runs {running(LABEL)} of {n}"
        for i in range(PROXIES):
            wait_serving(FLEET_PORT + i, REPLICAS, f"{PREFIX}{i}\n", deadline=10)
        noops, calls = [], []
        for _ in range(RUNS):
            t, r = timed(*berth(cfg, state, LABEL, "--output", "json", "up"))
            noops.append(t)
            calls.append(api_requests(r.stdout))
            changed = [l for l in r.stdout.splitlines() if '"summary"' not in l]
            assert not changed, f"a no-op up acted: {changed}"
        t_down_fleet, _ = timed(*berth(cfg, state, LABEL, "-q", "down"))
        assert running(LABEL) == 0, f"{running(LABEL)} containers left after berth down"

        # compose fleet: the same 30 containers
        os.makedirs(cdir)
        compose_project(cdir, PROXIES, REPLICAS, COMPOSE_PORT, LABEL)
        t_fresh_compose, _ = timed("docker-compose", "-p", PROJECT, "up", "-d", cwd=cdir)
        assert running(LABEL) == n, f"compose runs {running(LABEL)} of {n}"
        for i in range(PROXIES):
            wait_serving(COMPOSE_PORT + i, REPLICAS, "compose\n", deadline=30)
        cnoops = [timed("docker-compose", "-p", PROJECT, "up", "-d", cwd=cdir)[0] for _ in range(RUNS)]
        t_down_compose, _ = timed("docker-compose", "-p", PROJECT, "down", "-t", "1", cwd=cdir)
        assert running(LABEL) == 0, f"{running(LABEL)} containers left after docker-compose down"

        # fresh up of one proxy x3 vs the floor
        one = os.path.join(d, "one.toml")
        with open(one, "w") as f:
            f.write(fleet_toml(1, REPLICAS, ONE_PORT, "nf", min_ready="0s"))
        fresh, floors = [], []
        for _ in range(3):
            floors.append(floor_run(d, FLOOR_PORT, LABEL))
            t, _ = timed(*berth(one, state, LABEL, "-q", "up"))
            fresh.append(t)
            wait_serving(ONE_PORT, REPLICAS, "nf0\n", deadline=10)
            sh(*berth(one, state, LABEL, "-q", "down"))
    finally:
        cleanup(LABEL, dirs=(d, state), compose_dir=cdir, project=PROJECT)

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
    print(f"{'fresh up / floor (%d replicas + validate)' % REPLICAS:<{w}} {f3 / fl:>9.2f}x")


if __name__ == "__main__":
    sys.exit(main())
