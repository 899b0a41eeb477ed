#!/usr/bin/env python3
"""No-op reconcile, status and scrape at 30 and 102 replicas; fresh up and down against
docker-compose; each against its floor.

Run: scripts/bench.sh noop      (prints the tables; cleans up after itself)
     BENCH_RUNS=3 scripts/bench.sh noop      (fewer repetitions)

Per scale (10 proxies x 3 replicas, then 34 x 3):
- fresh `berth up` (min_ready 0s; at 30 replicas FRESH_RUNS times, each but the last followed by
  `berth down`, and the median is reported), then RUNS no-op `berth --output json up` (each must act on
  nothing and leave the same container IDs; berth's own count of Docker API requests), RUNS
  `berth status`, then `berth serve` on the converged fleet: its resident memory once idle and
  RUNS `/metrics` scrapes; then `berth down`;
- the floor of a no-op: one `GET /containers/json` answered by the same daemon, from a fresh
  process (curl --unix-socket), RUNS times.
Against docker-compose (10 services x scale 3, the same 30 hardened containers, one Envoy worker
each on both sides): fresh `up -d` (FRESH_RUNS times, as berth's), RUNS no-op `up -d` (same container IDs asserted), `ps`,
`--version` (Python start-up alone), `down -t 1`.
And fresh `up` of one proxy x 3 against the floor of one replica: `docker run` of one hardened
Envoy until /ready answers LIVE.

Its own label (io.berth.bench=noop), proxy names (nb*, nf0), compose project (bbnoop) and ports
(21000.., 21100.., 21300, 21500, status 21600): it never touches another benchmark's containers.
"""
import json, os, signal, statistics, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (run_benchmark, BASE_PORT, CONCURRENCY, HostSysctls, bench_label, berth, cleanup,  # noqa: E402
                    compose, compose_project, container_ids, fleet_toml, floor_list, floor_run,
                    remove_labelled, running, sh, terminate_on_sigterm, timed, wait_serving)

RUNS = int(os.environ.get("BENCH_RUNS", "5"))
FRESH_RUNS = 3                    # fresh up + down, on the fleet compared with compose
REPLICAS = 3
SCALES = (10, 34)                 # proxies; x REPLICAS = 30 and 102 replicas
COMPOSE_PROXIES = 10
LABEL = bench_label("noop")
PROJECT = "bbnoop"
PREFIX = "nb"
FLEET_PORT = BASE_PORT            # 21000..21033
COMPOSE_PORT = BASE_PORT + 100    # 21100..21109
ONE_PORT = BASE_PORT + 300
FLOOR_PORT = BASE_PORT + 500
STATUS_PORT = BASE_PORT + 600
med = statistics.median
children = []


def api_requests(stdout):
    """The count in `berth --output json up`'s final summary event."""
    events = [json.loads(l) for l in stdout.splitlines() if l.startswith("{")]
    summary = [e for e in events if e.get("event") == "summary"]
    if not summary:
        raise SystemExit(f"no summary event in berth's output:\n{stdout}")
    return int(summary[-1]["message"].split()[0])


def http(path, timeout=10):
    """(seconds, body) of one GET to serve's status server, from this process."""
    import urllib.request
    t = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{STATUS_PORT}{path}", timeout=timeout) as r:
        body = r.read().decode()
    return time.monotonic() - t, body


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def serve_converged(n_proxies):
    try:
        st = json.loads(http("/status")[1])
    except (OSError, ValueError):
        return False
    if len(st["proxies"]) != n_proxies:
        return False
    return all(not p["busy"] and len(p["replicas"]) == REPLICAS and all(r["ready"] for r in p["replicas"])
               for p in st["proxies"])


def measure_serve(d, cfg, state, n_proxies):
    """serve on the converged fleet: RSS once idle, RUNS /metrics scrapes, RSS after."""
    log = open(os.path.join(d, "serve.log"), "w")
    p = subprocess.Popen(berth(cfg, state, LABEL, "serve", "--listen", f"127.0.0.1:{STATUS_PORT}",
                               "--resync", "30s"), stdout=subprocess.DEVNULL, stderr=log)
    children.append(p)
    try:
        end = time.monotonic() + 120
        while not serve_converged(n_proxies):
            if p.poll() is not None or time.monotonic() > end:
                log.flush()
                raise SystemExit("serve did not report the fleet converged:\n"
                                 + open(os.path.join(d, "serve.log")).read()[-3000:])
            time.sleep(0.5)
        time.sleep(5)  # idle: only the event stream and the resync timer
        idle = rss_mib(p.pid)
        scrapes, lines = [], 0
        for _ in range(RUNS):
            t, body = http("/metrics")
            scrapes.append(t)
            lines = body.count("\n")
        return dict(rss_idle=idle, scrape=med(scrapes), scrape_lines=lines, rss_after=rss_mib(p.pid))
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        log.close()


def berth_scale(d, state, n_proxies):
    n = n_proxies * REPLICAS
    cfg = os.path.join(d, f"fleet{n_proxies}.toml")
    with open(cfg, "w") as f:
        f.write(fleet_toml(n_proxies, REPLICAS, FLEET_PORT, PREFIX, min_ready="0s"))
    fresh_runs, down_runs = [], []
    for last in [False] * (fresh_runs_at(n_proxies) - 1) + [True]:
        t, _ = timed(*berth(cfg, state, LABEL, "-q", "up"))
        fresh_runs.append(t)
        assert running(LABEL) == n, f"berth runs {running(LABEL)} of {n}"
        for i in range(n_proxies):
            wait_serving(FLEET_PORT + i, REPLICAS, f"{PREFIX}{i}\n", deadline=20)
        if not last:
            down_runs.append(berth_down(cfg, state))
    ids = container_ids(LABEL)
    noops, calls, statuses, floors = [], [], [], []
    for _ in range(RUNS):
        floors.append(floor_list())
        t, r = timed(*berth(cfg, state, LABEL, "--output", "json", "up"))
        noops.append(t)
        calls.append(api_requests(r.stdout))
        acted = [l for l in r.stdout.splitlines() if '"summary"' not in l]
        assert not acted, f"a no-op berth up acted: {acted}"
        assert container_ids(LABEL) == ids, "a no-op berth up changed the containers"
        t, r = timed(*berth(cfg, state, LABEL, "status"))
        assert r.stdout.count("LIVE") >= n, f"berth status shows fewer than {n} LIVE replicas:\n{r.stdout}"
        statuses.append(t)
    serve = measure_serve(d, cfg, state, n_proxies)
    assert container_ids(LABEL) == ids, "serve changed a converged fleet"
    down_runs.append(berth_down(cfg, state))
    return dict(n=n, proxies=n_proxies, fresh=med(fresh_runs), down=med(down_runs),
                fresh_runs=len(fresh_runs), noop=med(noops), calls=med(calls),
                status=med(statuses), floor=med(floors), **serve)


def fresh_runs_at(n_proxies):
    """Fresh up and down are repeated on the fleet compared with compose only."""
    return FRESH_RUNS if n_proxies == COMPOSE_PROXIES else 1


def berth_down(cfg, state):
    t, _ = timed(*berth(cfg, state, LABEL, "-q", "down"))
    assert running(LABEL) == 0, f"{running(LABEL)} containers left after berth down"
    return t


def compose_fleet(cdir):
    n = COMPOSE_PROXIES * REPLICAS
    os.makedirs(cdir)
    compose_project(cdir, COMPOSE_PROXIES, REPLICAS, COMPOSE_PORT, LABEL)
    fresh_runs, serving_runs, down_runs = [], [], []
    for last in [False] * (FRESH_RUNS - 1) + [True]:
        t0 = time.monotonic()
        compose(cdir, PROJECT, "up", "-d")
        fresh_runs.append(time.monotonic() - t0)
        assert running(LABEL) == n, f"compose runs {running(LABEL)} of {n}"
        for i in range(COMPOSE_PROXIES):
            wait_serving(COMPOSE_PORT + i, REPLICAS, "compose\n", deadline=60)
        serving_runs.append(time.monotonic() - t0)
        if not last:
            down_runs.append(compose_down(cdir))
    ids = container_ids(LABEL)
    noops, ps, version, floors = [], [], [], []
    for _ in range(RUNS):
        floors.append(floor_list())
        t, r = timed("docker-compose", "-p", PROJECT, "up", "-d", cwd=cdir)
        noops.append(t)
        assert container_ids(LABEL) == ids, f"a no-op docker-compose up -d changed the containers:\n{r.stderr}"
        ps.append(timed("docker-compose", "-p", PROJECT, "ps", cwd=cdir)[0])
        version.append(timed("docker-compose", "--version")[0])
    down_runs.append(compose_down(cdir))
    return dict(n=n, fresh=med(fresh_runs), fresh_serving=med(serving_runs), noop=med(noops),
                ps=med(ps), version=med(version), floor=med(floors), down=med(down_runs))


def compose_down(cdir):
    t, _ = timed("docker-compose", "-p", PROJECT, "down", "-t", "1", cwd=cdir)
    assert running(LABEL) == 0, f"{running(LABEL)} containers left after docker-compose down"
    return t


def one_proxy(d, state):
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
    return med(fresh), med(floors)


def main():
    terminate_on_sigterm()
    d = tempfile.mkdtemp(prefix="bb-noop-", dir="/tmp")
    state = tempfile.mkdtemp(prefix="bb-noop-state-", dir="/tmp")
    cdir = os.path.join(d, "compose")
    if remove_labelled(LABEL):
        sys.stderr.write(f"removed containers left by an earlier run ({LABEL})\n")
    try:
        with HostSysctls():
            scales = [berth_scale(d, state, p) for p in SCALES]
            c = compose_fleet(cdir)
            f3, fl = one_proxy(d, state)
    finally:
        for p in children:
            if p.poll() is None:
                p.kill()
                p.wait()
        cleanup(LABEL, dirs=(d, state), compose_dir=cdir, project=PROJECT)
    report(scales, c, f3, fl)


def report(scales, c, f3, fl):
    b = scales[0]
    assert b["n"] == c["n"]
    print()
    print(f"Baseline: Debian's docker-compose 1.29 (Python), the only compose installable on this host")
    print("(compose v2 cannot be installed here). Each of its commands starts a Python interpreter")
    print("and imports docker-py first, so a compose no-op mostly measures that start-up: see the")
    print("`docker-compose --version` row. Floor: the same daemon answering one GET /containers/json")
    print(f"to a fresh process (curl --unix-socket). Envoy runs --concurrency {CONCURRENCY} on both sides.")
    print(f"Times are medians of {RUNS} runs unless stated.")
    print()
    w = 56
    hdr = "".join(f"{'%d x %d = %d' % (s['proxies'], REPLICAS, s['n']):>16}" for s in scales)
    print(f"berth, by fleet size{'':<{w - 20}}{hdr}")
    print("-" * (w + 16 * len(scales)))

    def row(name, f):
        print(f"{name:<{w}}" + "".join(f"{f(s):>16}" for s in scales))
    row("floor: curl GET /containers/json", lambda s: f"{s['floor'] * 1000:.0f} ms")
    row("no-op `berth up` (same container IDs after)", lambda s: f"{s['noop'] * 1000:.0f} ms")
    row("  / floor", lambda s: f"{s['noop'] / s['floor']:.1f}x")
    row("  Docker API requests (berth's count)", lambda s: f"{s['calls']:.0f}")
    row("`berth status`", lambda s: f"{s['status'] * 1000:.0f} ms")
    row("serve: /metrics scrape", lambda s: f"{s['scrape'] * 1000:.0f} ms")
    row("serve: /metrics lines", lambda s: f"{s['scrape_lines']}")
    row("serve: resident memory (VmRSS), idle", lambda s: f"{s['rss_idle']:.1f} MiB")
    row("serve: resident memory after the scrapes", lambda s: f"{s['rss_after']:.1f} MiB")
    row("fresh `berth up` (runs: median of the column's)", lambda s: f"{s['fresh']:.2f} s")
    row("`berth down` (runs: median of the column's)", lambda s: f"{s['down']:.2f} s")
    row("  runs of fresh up and down", lambda s: f"{s['fresh_runs']}")
    print()
    print(f"berth vs docker-compose, {COMPOSE_PROXIES} proxies x {REPLICAS} replicas = {c['n']} containers")
    print(f"{'':<{w}}{'berth':>16}{'docker-compose':>16}{'compose/berth':>15}")
    print("-" * (w + 47))
    print(f"{'floor: curl GET /containers/json':<{w}}{b['floor'] * 1000:>13.0f} ms{c['floor'] * 1000:>13.0f} ms")
    print(f"{'no-op `up` (same container IDs after: checked)':<{w}}{b['noop'] * 1000:>13.0f} ms"
          f"{c['noop'] * 1000:>13.0f} ms{c['noop'] / b['noop']:>14.1f}x")
    print(f"{'  docker-compose --version (Python start-up alone)':<{w}}{'':>16}{c['version'] * 1000:>13.0f} ms")
    print(f"{'`berth status` / `docker-compose ps`':<{w}}{b['status'] * 1000:>13.0f} ms"
          f"{c['ps'] * 1000:>13.0f} ms{c['ps'] / b['status']:>14.1f}x")
    print(f"{'fresh `up` until the command returns (median of %d)' % FRESH_RUNS:<{w}}{b['fresh']:>14.2f} s{c['fresh']:>14.2f} s"
          f"{c['fresh'] / b['fresh']:>14.2f}x")
    print(f"{'fresh `up` until every replica serves (median of %d)' % FRESH_RUNS:<{w}}{b['fresh']:>14.2f} s{c['fresh_serving']:>14.2f} s"
          f"{c['fresh_serving'] / b['fresh']:>14.2f}x")
    print(f"{'`down` (median of %d)' % FRESH_RUNS:<{w}}{b['down']:>14.2f} s{c['down']:>14.2f} s{c['down'] / b['down']:>14.2f}x")
    print("  fresh up waits for: berth: every replica LIVE with its listeners bound (min_ready 0s here;")
    print("    a fresh proxy's replicas are its validation, `envoy --mode validate` runs only when one")
    print("    fails); compose: nothing (containers started; 'until every replica serves' polls the")
    print("    ports from the benchmark, 0.1 s steps).")
    print("  down waits for: berth: each replica fails its health check, drains until 0 connections")
    print("    (none here), closes its listeners, then stop + remove; compose: SIGTERM, stop (-t 1), remove.")
    print()
    print(f"{'fresh up, 1 proxy x %d replicas (median of 3)' % REPLICAS:<{w}}{f3:>14.2f} s")
    print(f"{'floor: docker run of 1 Envoy until /ready LIVE (median of 3)':<{w}}{fl:>14.2f} s")
    print(f"{'fresh up / floor (%d replicas)' % REPLICAS:<{w}}{f3 / fl:>14.2f}x")


if __name__ == "__main__":
    sys.exit(run_benchmark("noop", main))
