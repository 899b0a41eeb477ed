#!/usr/bin/env python3
"""Rolling upgrade under load: berth vs docker-compose, in one run.

Run: scripts/bench.sh rollout      (prints a table; cleans up after itself)
     BENCH_ROLLOUTS=2 scripts/bench.sh rollout      (a short run)
     BENCH_BIG=0 scripts/bench.sh rollout           (without the 32-replica rollout)
     BENCH_TRACE=DIR scripts/bench.sh rollout       (also each berth rollout's events, timestamped
                                                     as they arrived, to DIR/<surge>-<n>.events)

berth runs three times, with `max_surge = 1` (one replica after another), with its default
`max_surge` and with "100%" (every replica in one wave), beside compose, in one run. Then one 32-replica berth rollout at berth's default
settings (`min_ready` 2s, `min_drain_duration` 1s, default `max_surge`) under the same load:
its time is reported (compose is not run at 32).

Both fleets are 3 Envoy replicas on one host port (host networking, SO_REUSEPORT), upgraded
1.39.3 -> 1.40.0 (and back) under wrk keep-alive load (50 connections, 2 threads, 127.0.0.1 only).
- berth: `berth up` after the image changes in the config, ROLLOUTS times, alternating;
- compose: `docker-compose up -d` after the image changes in the compose file, ROLLOUTS times;
- before any load, each fleet must serve on 127.0.0.1:PORT from 3 Envoy processes (asserted);
  each rollout ends when the port again serves from 3 processes, then the load runs 2s more;
- the same load window on both sides: SETTLE s of load, the rollout command, until the port
  serves from 3 processes again, SETTLE s more; nothing else runs in it;
- failed requests = wrk socket errors + non-2xx (while no listener is open, wrk reconnects in a
  loop and files each refused attempt as a read error: the count measures retries, not
  clients), also per connection (50); the outage = the longest time without a 2xx on any connection (wrk Lua,
  threads merged, 1 ms resolution); the longest wait = the longest one connection waited for an
  answer (wrk's longest request latency), a stall of one connection that the outage hides;
- per-replica time: from berth's `replacing` event of a slot to the `removed` event of that
  slot's old container (events timestamped as they arrive), split into create+start until LIVE,
  min_ready (configured), drain (from the `drained` event) and stop+remove, against the floor:
  `docker run` of one hardened Envoy until /ready is LIVE, measured in the same run under the
  same wrk load in a load window of its own just before each berth rollout's (and once without
  load, for reference);
- Envoy runs with one worker (--concurrency 1) on both sides.

Its own label (io.berth.bench=rollout), proxy name (rb0), compose project (bbrollout) and ports
(21700, floor 21701): it never touches another benchmark's containers.
"""
import json, os, re, signal, statistics, subprocess, sys, tempfile, threading, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (run_benchmark, BASE_PORT, CONCURRENCY, HostSysctls, bench_label, berth, cleanup, compose, compose_project, fleet_toml,  # noqa: E402
                    floor_run, remove_labelled, running, sh, terminate_on_sigterm, wait_serving)

ROLLOUTS = int(os.environ.get("BENCH_ROLLOUTS", "10"))
BIG = int(os.environ.get("BENCH_BIG", "32"))   # replicas of the one rollout at the defaults; 0: none
SURGES = (1, None, "100%")                      # max_surge of berth's runs; None: berth's default
OLD, NEW = "berth/envoy:1.39.3", "berth/envoy:1.40.0"
LABEL = bench_label("rollout")
PROJECT = "bbrollout"
PREFIX = "rb"
PROXY = PREFIX + "0"
PORT = BASE_PORT + 700
FLOOR_PORT = BASE_PORT + 701
REPLICAS = 3
MIN_READY_S, DRAIN = 1.0, "10s"
SETTLE = 2.0            # seconds of load before and after each rollout
CONNECTIONS, THREADS = 50, 2
WRK_MAX = 600           # wrk's own bound (-d); it is stopped with SIGINT long before
ROLLOUT_DEADLINE = 180  # one `berth up` / `docker-compose up -d` may take at most this long
HERE = os.path.dirname(os.path.abspath(__file__))
TRACE = os.environ.get("BENCH_TRACE")  # a directory for each berth rollout's timed events


def trace(name, events):
    """Writes one rollout's events, each with the seconds since `berth up` began, to TRACE."""
    if not TRACE:
        return
    os.makedirs(TRACE, exist_ok=True)
    with open(os.path.join(TRACE, f"{name}.events"), "w") as f:
        for t, e in events:
            f.write(f"{t:8.3f} {json.dumps(e)}\n")

children = []  # every wrk and `berth up` started, killed in main's finally before the cleanup


def start_wrk(port):
    p = subprocess.Popen(
        ["wrk", f"-t{THREADS}", f"-c{CONNECTIONS}", f"-d{WRK_MAX}s", "-s", os.path.join(HERE, "gap.lua"), f"http://127.0.0.1:{port}/"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    children.append(p)
    return p


def stop_wrk(p):
    """SIGINT (wrk prints its summary): connect errors, other socket errors + non-2xx, requests,
    the outage (longest time without a 2xx on any connection), the longest wait of one connection
    for an answer."""
    if p.poll() is not None:
        raise SystemExit(f"wrk ended before it was stopped (exit {p.returncode}):\n{p.stdout.read()}")
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=30)
    reqs = re.search(r"(\d+) requests in", out)
    wait = re.search(r"MAXWAIT ([\d.]+)", out)
    outage = re.search(r"OUTAGE ([\d.]+)", out)
    if not reqs or not wait or not outage:
        raise SystemExit(f"cannot read wrk's summary:\n{out}")
    connect = other = 0
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if m:
        connect = int(m.group(1))
        other += sum(int(x) for x in m.groups()[1:])
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if m:
        other += int(m.group(1))
    return dict(errors=connect + other, connect=connect, other=other, reqs=int(reqs.group(1)),
                wait=float(wait.group(1)), outage=float(outage.group(1)), wrk=out)


def images(label):
    return sorted(sh("docker", "ps", "--filter", f"label={label}", "--format", "{{.Image}}").stdout.split())


def berth_up_events(cmd, log):
    """Runs `berth --output json up`, timestamping each event line as it arrives. Returns
    (exit code, seconds, [(t, event dict)])."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
    children.append(p)
    timer = threading.Timer(ROLLOUT_DEADLINE, p.kill)
    timer.start()
    events = []
    try:
        for line in iter(p.stdout.readline, ""):
            t = time.monotonic() - t0
            if line.startswith("{"):
                events.append((t, json.loads(line)))
        rc = p.wait()
    finally:
        timer.cancel()
        if p.poll() is None:
            p.kill()
            p.wait()
    return rc, time.monotonic() - t0, events


def replicas_of(events):
    """Per slot, the replacement's steps: `replacing` (slot, old) -> `created`/`ready` (slot, new)
    -> `draining`/`drained`/`removed` (old container, no slot). Only complete ones."""
    by_slot, slot_of_old = {}, {}
    for t, e in events:
        kind, slot, c = e.get("event"), e.get("slot"), e.get("container")
        if kind == "replacing":
            by_slot[slot] = dict(slot=slot, old=c, replacing=t)
            slot_of_old[c] = slot
        elif kind in ("created", "ready") and slot in by_slot:
            by_slot[slot][kind] = t
        elif kind in ("draining", "drained", "removed") and c in slot_of_old:
            r = by_slot[slot_of_old[c]]
            r[kind] = t
            if kind == "drained":
                m = re.search(r"(\d+) connection\(s\) left after ([\d.]+)s", e.get("message", ""))
                if m:
                    r["left"], r["drain"] = int(m.group(1)), float(m.group(2))
    out = []
    for r in by_slot.values():
        if all(k in r for k in ("replacing", "created", "ready", "draining", "drained", "removed", "drain")):
            r["total"] = r["removed"] - r["replacing"]
            r["to_live"] = r["ready"] - r["replacing"] - MIN_READY_S
            r["create_start"] = r["created"] - r["replacing"]
            r["boot"] = r["to_live"] - r["create_start"]
            r["stop_remove"] = r["removed"] - r["drained"]
            r["other"] = r["total"] - r["to_live"] - MIN_READY_S - r["drain"] - r["stop_remove"]
            r["wave_wait"] = r["draining"] - r["ready"]  # ready, its old one waits for the wave
            out.append(r)
    return out


def berth_rollouts(d, state, floors, floors_idle, max_surge):
    cfg = os.path.join(d, "berth.toml")
    body = f"{PROXY}\n"

    def write(image):
        with open(cfg, "w") as f:
            f.write(fleet_toml(1, REPLICAS, PORT, PREFIX, min_ready=f"{MIN_READY_S}s", image=image,
                               drain_timeout=DRAIN, max_surge=max_surge))
    write(OLD)
    sh(*berth(cfg, state, LABEL, "-q", "up"))
    assert running(LABEL) == REPLICAS, f"berth runs {running(LABEL)} of {REPLICAS} replicas"
    wait_serving(PORT, REPLICAS, body)
    results = []
    log_path = os.path.join(d, "berth-up.log")
    for i in range(ROLLOUTS):
        floors_idle.append(floor_run(d, FLOOR_PORT, LABEL))
        # The floor under the same load as the replicas berth starts next (its own port), in a
        # load window of its own: berth's window below holds the rollout alone, as compose's.
        wrk = start_wrk(PORT)
        time.sleep(SETTLE / 2)
        floors.append(floor_run(d, FLOOR_PORT, LABEL))
        stop_wrk(wrk)
        image = NEW if i % 2 == 0 else OLD
        write(image)
        wrk = start_wrk(PORT)
        time.sleep(SETTLE)
        t0 = time.monotonic()
        with open(log_path, "w") as log:
            rc, total, events = berth_up_events(berth(cfg, state, LABEL, "--output", "json", "up"), log)
        if rc != 0:
            sys.stderr.write(f"berth up exited {rc}; stderr:\n{open(log_path).read()}\nevents:\n"
                             + "\n".join(f"{t:7.3f} {json.dumps(e)}" for t, e in events) + "\n")
        wait_serving(PORT, REPLICAS, body)
        serving = time.monotonic() - t0
        time.sleep(SETTLE)
        w = stop_wrk(wrk)
        reps = replicas_of(events)
        trace(f"{'default' if max_surge is None else str(max_surge).rstrip('%')}-{i + 1}", events)
        now = images(LABEL)
        results.append(dict(rc=rc, total=total, serving=serving, replicas=reps, events=events,
                            on_new_image=now == [image] * REPLICAS, **w))
        if len(reps) != REPLICAS:
            sys.stderr.write(f"berth rollout {i + 1}: {len(reps)} complete replacements, expected {REPLICAS}; events:\n"
                             + "\n".join(f"{t:7.3f} {json.dumps(e)}" for t, e in events) + "\n")
    sh(*berth(cfg, state, LABEL, "-q", "down"))
    return results


def compose_rollouts(cdir):
    os.makedirs(cdir)
    body = "compose\n"
    compose_project(cdir, 1, REPLICAS, PORT, LABEL, image=OLD)
    compose(cdir, PROJECT, "up", "-d")
    assert running(LABEL) == REPLICAS, f"compose runs {running(LABEL)} of {REPLICAS} replicas"
    wait_serving(PORT, REPLICAS, body)  # the compose replicas serve before any load
    results = []
    for i in range(ROLLOUTS):
        image = NEW if i % 2 == 0 else OLD
        compose_project(cdir, 1, REPLICAS, PORT, LABEL, image=image)
        wrk = start_wrk(PORT)
        time.sleep(SETTLE)
        t0 = time.monotonic()
        r = compose(cdir, PROJECT, "up", "-d", check=False, timeout=ROLLOUT_DEADLINE)
        total = time.monotonic() - t0
        wait_serving(PORT, REPLICAS, body)
        serving = time.monotonic() - t0
        time.sleep(SETTLE)
        w = stop_wrk(wrk)
        results.append(dict(rc=r.returncode, total=total, serving=serving, replicas=[], events=[],
                            on_new_image=images(LABEL) == [image] * REPLICAS, **w))
    compose(cdir, PROJECT, "down", "-t", "1", check=False)
    return results


def main():
    terminate_on_sigterm()
    d = tempfile.mkdtemp(prefix="bb-roll-", dir="/tmp")
    state = tempfile.mkdtemp(prefix="bb-roll-state-", dir="/tmp")
    cdir = os.path.join(d, "compose")
    if remove_labelled(LABEL):
        sys.stderr.write(f"removed containers left by an earlier run ({LABEL})\n")
    try:
        floors, floors_idle = [], []
        with HostSysctls():
            bs = [berth_rollouts(d, state, floors, floors_idle, m) for m in SURGES]
            c = compose_rollouts(cdir)
            big = big_rollout(d, state) if BIG else None
    finally:
        for p in children:
            if p.poll() is None:
                p.kill()
                p.wait()
        cleanup(LABEL, dirs=(d, state), compose_dir=cdir, project=PROJECT)
    for m, b in zip(SURGES, bs):
        report(b, c, floors, floors_idle, m)
    report_side_by_side(bs, c)
    if big:
        report_big(big)


def big_rollout(d, state):
    """One rollout of BIG replicas at berth's defaults under the same load: (exit code, seconds,
    failed requests, requests, outage, events)."""
    cfg = os.path.join(d, "berth.toml")
    body = f"{PROXY}\n"

    def write(image):
        with open(cfg, "w") as f:
            f.write(fleet_toml(1, BIG, PORT, PREFIX, min_ready="2s", image=image, drain_timeout=DRAIN,
                               min_drain_duration="1s"))
    write(OLD)
    sh(*berth(cfg, state, LABEL, "-q", "up"))
    wait_serving(PORT, BIG, body)
    write(NEW)
    wrk = start_wrk(PORT)
    time.sleep(SETTLE)
    log_path = os.path.join(d, "berth-up-big.log")
    with open(log_path, "w") as log:
        rc, total, events = berth_up_events(berth(cfg, state, LABEL, "--output", "json", "up"), log)
    trace(f"big-{BIG}", events)
    if rc != 0:
        sys.stderr.write(f"berth up ({BIG} replicas) exited {rc}; stderr:\n{open(log_path).read()}\n")
    wait_serving(PORT, BIG, body)
    time.sleep(SETTLE)
    w = stop_wrk(wrk)
    sh(*berth(cfg, state, LABEL, "-q", "down"))
    surge = next((e.get("message", "") for _, e in events if e.get("event") == "surge"), "")
    lowered = next((e.get("message", "") for _, e in events if e.get("event") == "surge-lowered"), "")
    return dict(rc=rc, total=total, surge=surge, lowered=lowered, **w)


def report_side_by_side(bs, c):
    """The runs of this one benchmark side by side: each berth max_surge and compose."""
    med = statistics.median
    print()
    print(f"Side by side ({REPLICAS} replicas, {ROLLOUTS} rollouts each, the same load and window):")
    print(f"  {'':<34} {'time (median)':>14} {'/ compose':>10} {'min..max':>14} {'failed':>8} {'outage max':>11}"
          f" {'longest wait':>13}")
    def policy(rs):  # what the `surge` event says, e.g. "(max_surge 50%)"
        m = next((re.search(r"max_surge ([^)]+)", e.get("message", "")) for r in rs for _, e in r["events"]
                  if e.get("event") == "surge"), None)
        return m.group(1) if m else "?"
    rows = [(f"berth max_surge {policy(b)}" + (" (default)" if m is None else ""), b) for m, b in zip(SURGES, bs)]
    rows.append(("docker-compose (recreate)", c))
    cmed = med([r["total"] for r in c])
    for name, rs in rows:
        t = [r["total"] for r in rs]
        print(f"  {name:<34} {med(t):>13.2f}s {med(t) / cmed:>9.2f}x {min(t):>6.2f}..{max(t):<6.2f}"
              f" {sum(r['errors'] for r in rs):>8} {max(r['outage'] for r in rs):>10.3f}s"
              f" {max(r['wait'] for r in rs):>12.3f}s")


def report_big(r):
    print()
    print(f"One rollout of {BIG} replicas ({OLD} -> {NEW}) at berth's defaults (min_ready 2s,"
          f" min_drain_duration 1s, default max_surge), same wrk load:")
    print(f"  berth up: {r['total']:.2f}s, exit {r['rc']}; {r['surge']}" + (f"; {r['lowered']}" if r["lowered"] else ""))
    print(f"  failed requests {r['errors']} of {r['reqs']}, outage {r['outage']:.3f}s, longest wait {r['wait']:.3f}s")


def report(b, c, floors, floors_idle, max_surge):
    med = statistics.median
    w = 52
    print()
    surge = "berth's default max_surge" if max_surge is None else f"max_surge = {max_surge}"
    print(f"== berth with {surge} ==")
    print(f"Rolling upgrade of {REPLICAS} replicas ({OLD} <-> {NEW}) under wrk load "
          f"({CONNECTIONS} keep-alive connections, {THREADS} threads, 127.0.0.1), {ROLLOUTS} rollouts each.")
    print("Baseline: Debian's docker-compose 1.29 (Python; compose v2 cannot be installed on this host),")
    print("`up -d` after the image changed: it stops and recreates every replica at once, so the port")
    print("is closed for a while and wrk's connections reconnect in a loop; each refused attempt counts")
    print("as an error (wrk files a refused non-blocking connect under 'read'), so the raw count measures")
    print("how fast wrk retries. Compare the outage and the failures per connection, not the raw count.")
    print(f"Same load window on both sides ({SETTLE:.0f} s of load, the rollout, until 3 processes serve again,"
          f" {SETTLE:.0f} s more);")
    print(f"Envoy --concurrency {CONCURRENCY} on both sides; net.ipv4.tcp_migrate_req=1 (set by berth) for both.")
    print(f"{'':<{w}} {'berth':>14} {'docker-compose':>16}")
    print("-" * (w + 32))

    def row(name, f, fmt):
        print(f"{name:<{w}} {format(f(b), fmt):>14} {format(f(c), fmt):>16}")
    row("outage: longest time without any 2xx (max), s", lambda rs: max(r["outage"] for r in rs), ".3f")
    row("outage (median of the rollouts), s", lambda rs: med([r["outage"] for r in rs]), ".3f")
    row("longest wait of one connection for an answer, s", lambda rs: max(r["wait"] for r in rs), ".3f")
    row("failed requests per connection (per rollout, max)",
        lambda rs: max(r["errors"] for r in rs) / CONNECTIONS, ".1f")
    row("failed requests, total", lambda rs: sum(r["errors"] for r in rs), "d")
    row("  wrk 'connect' errors", lambda rs: sum(r["connect"] for r in rs), "d")
    row("  wrk 'read'/'write'/'timeout' errors + non-2xx", lambda rs: sum(r["other"] for r in rs), "d")
    row("failed requests, worst rollout", lambda rs: max(r["errors"] for r in rs), "d")
    row("requests served, total", lambda rs: sum(r["reqs"] for r in rs), "d")
    row("rollout command time (median), s", lambda rs: med([r["total"] for r in rs]), ".2f")
    row("until 3 replicas serve again (median), s", lambda rs: med([r["serving"] for r in rs]), ".2f")
    row("rollouts that failed (exit != 0)", lambda rs: sum(1 for r in rs if r["rc"] != 0), "d")
    ratio = med([r["total"] for r in b]) / med([r["total"] for r in c])
    print(f"{'rollout time, berth / compose (medians)':<{w}} {ratio:>14.2f}x")
    row("rollouts not on the new image after", lambda rs: sum(1 for r in rs if not r["on_new_image"]), "d")
    print("  waits for: berth: validate the new bootstrap, per replica start, LIVE + listeners bound,")
    print(f"    min_ready {MIN_READY_S:.0f} s, drain the old one until 0 connections, stop + remove; compose: nothing")
    print("    (stop and recreate; 'until 3 replicas serve again' polls from the benchmark, 0.1 s steps).")
    print()
    per = [x for r in b for x in r["replicas"]]
    floor = med(floors)
    expected = REPLICAS * ROLLOUTS
    if not per:
        print(f"per-replica breakdown: no complete replacement in berth's events (expected {expected})")
        return
    comp = {k: med([x[k] for x in per])
            for k in ("total", "to_live", "create_start", "boot", "drain", "stop_remove", "other", "left")}
    goal = 1.2 * floor + MIN_READY_S + comp["drain"]
    met = sum(1 for x in per if x["total"] <= 1.2 * floor + MIN_READY_S + x["drain"])
    print(f"berth per-replica replace time, `replacing` -> `removed` of a slot (median of {len(per)}"
          f" replacements{'' if len(per) == expected else f', EXPECTED {expected}'}):")
    print(f"  {'create + start until LIVE':<40} {comp['to_live']:>7.2f}s"
          f"   (create + start {comp['create_start']:.2f}s, then until LIVE + listeners {comp['boot']:.2f}s)")
    print(f"  {'min_ready (configured)':<40} {MIN_READY_S:>7.2f}s")
    print(f"  {'drain (until 0 connections; timeout ' + DRAIN + ')':<40} {comp['drain']:>7.2f}s"
          f"   ({comp['left']:.0f} connection(s) left, median)")
    print(f"  {'stop + remove':<40} {comp['stop_remove']:>7.2f}s")
    print(f"  {'other (between the steps)':<40} {comp['other']:>7.2f}s")
    waits = [x["wave_wait"] for x in per]
    print(f"  {'  of it: ready -> its old one draining':<40} {med(waits):>7.2f}s"
          f"   (max {max(waits):.2f}s: a wave's old replicas drain once its slowest new one is ready)")
    print(f"  {'per replica':<40} {comp['total']:>7.2f}s")
    idle = med(floors_idle)
    print(f"floor: docker run of 1 hardened Envoy until /ready LIVE, under the same wrk load (median of"
          f" {len(floors)}): {floor:.2f}s; create + start until LIVE / floor = {comp['to_live'] / floor:.2f}x")
    print(f"       the same without load (median of {len(floors_idle)}): {idle:.2f}s"
          f" (goal against it: {1.2 * idle + MIN_READY_S + comp['drain']:.2f}s)")
    print(f"goal: per replica <= 1.2 x floor + min_ready + drain = 1.2 x {floor:.2f} + {MIN_READY_S:.2f}"
          f" + {comp['drain']:.2f} = {goal:.2f}s -> {'met' if comp['total'] <= goal else 'NOT met'}"
          f" (median {comp['total']:.2f}s; {met} of {len(per)} replacements within their own goal)")
    print()
    print("per rollout:   berth: failed (connect) / requests / outage / longest wait / time"
          "     compose: failed (connect) / requests / outage / longest wait / time")
    for i, (x, y) in enumerate(zip(b, c)):
        print(f"  {i + 1:>3}  {x['errors']:>8} ({x['connect']:>6}) {x['reqs']:>9} {x['outage']:>6.3f}s {x['wait']:>6.3f}s"
              f" {x['total']:>6.2f}s"
              f"  {y['errors']:>12} ({y['connect']:>6}) {y['reqs']:>9} {y['outage']:>6.3f}s {y['wait']:>6.3f}s"
              f" {y['total']:>6.2f}s")


if __name__ == "__main__":
    sys.exit(run_benchmark("rollout", main))
