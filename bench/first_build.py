#!/usr/bin/env python3
"""The README's first build: `cargo build --release --timings` of a clean clone of HEAD in a
fresh target directory (the static build: .cargo/config.toml names the host's target).

Run: scripts/bench.sh first_build      (prints the wall and CPU time and cargo's slowest units)

Crates come from cargo's local cache when it has them (a fresh machine downloads them first:
add that time). The wall time depends on the load: the header and footer give the load average
at the start and the end; CPU time (user + system of every compiler process) depends on it
less. Cargo's own report (cargo-timing.html) is kept beside the results file.
"""
import json, os, re, resource, shutil, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, run_benchmark  # noqa: E402

SLOWEST = 15


def units(html):
    m = re.search(r"const UNIT_DATA = (\[.*?\]);\n", html, re.S)
    return json.loads(m.group(1)) if m else []


def main():
    with tempfile.TemporaryDirectory(prefix="berth-first-build") as d:
        src = os.path.join(d, "berth")
        subprocess.run(["git", "clone", "--quiet", ROOT, src], check=True)
        commit = subprocess.run(["git", "-C", src, "rev-parse", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
        env = dict(os.environ, CARGO_TARGET_DIR=os.path.join(d, "target"))
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        r = subprocess.run(["cargo", "build", "--release", "--timings"], cwd=src, env=env,
                           capture_output=True, text=True)
        wall = time.monotonic() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if r.returncode != 0:
            sys.stderr.write(r.stderr)
            return 1
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        report = os.path.join(d, "target", "cargo-timings", "cargo-timing.html")
        with open(report) as f:
            html = f.read()
        out_dir = os.environ.get("BENCH_RESULTS", os.path.join(ROOT, "bench", "results"))
        shutil.copy(report, os.path.join(out_dir, "first_build-cargo-timing.html"))
        lock = subprocess.run(["grep", "-c", "^name = ", os.path.join(src, "Cargo.lock")],
                              capture_output=True, text=True).stdout.strip()
        built = units(html)
    print(f"cargo build --release --timings of a clean clone of {commit[:12]}, fresh target directory")
    print(f"({lock} packages in Cargo.lock, dev-dependencies included; {len(built)} units built)")
    print()
    print(f"{'wall time':<44}{wall:>8.0f} s  ({int(wall // 60)} m {wall % 60:.0f} s)")
    print(f"{'CPU time, user + system (all rustc and cc)':<44}{cpu:>8.0f} s  "
          f"({cpu / (os.cpu_count() or 1):.0f} s per core on {os.cpu_count()} cores)")
    print()
    print(f"cargo's slowest {SLOWEST} units (cargo-timing.html; wall time of each, overlapping):")
    for u in sorted(built, key=lambda u: -u["duration"])[:SLOWEST]:
        target = u.get("target", "").strip()
        print(f"  {u['name'] + ' ' + u['version']:<36}{target:<28}{u['duration']:>7.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(run_benchmark("first_build", main))
