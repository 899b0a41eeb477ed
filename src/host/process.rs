//! What /proc tells of one replica's process for the liveness judge
//! ([`crate::core::liveness`]): whether a signal stopped it, and how much CPU its container
//! has used. Cheap reads (one or two small files per replica per look).

use std::fs;
use std::time::Duration;

/// Whether process `pid` is stopped by a signal (SIGSTOP, SIGTSTP…) or by a tracer: state
/// `T` or `t` in `/proc/PID/stat`. False when it cannot be read.
pub fn stopped_by_signal(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| state_of_stat(&s))
        .is_some_and(|c| c == 'T' || c == 't')
}

/// The state letter of a `/proc/PID/stat` line (after the parenthesised command, which may
/// itself hold spaces and parentheses).
fn state_of_stat(stat: &str) -> Option<char> {
    stat.get(stat.rfind(')')? + 1..)?
        .trim_start()
        .chars()
        .next()
}

/// The CPU time used so far by the cgroup process `pid` runs in (its container: every thread
/// and child of the replica), else by the process's own threads (a process in the root
/// cgroup). None when neither can be read.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let cgroup = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok();
    cgroup
        .as_deref()
        .and_then(cgroup_cpu_time)
        .or_else(|| threads_cpu_time(pid))
}

/// The cgroup's CPU use: cgroup v2's `cpu.stat` (`usage_usec`) for the unified line, v1's
/// `cpuacct.usage` (nanoseconds) for the line naming the cpuacct controller.
fn cgroup_cpu_time(cgroup: &str) -> Option<Duration> {
    for line in cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        // The root cgroup is the whole host's, not a container's.
        if path != "/" && controllers.split(',').any(|c| c == "cpuacct") {
            for mount in ["cpuacct", "cpu,cpuacct", "cpuacct,cpu"] {
                let file = format!("/sys/fs/cgroup/{mount}{path}/cpuacct.usage");
                if let Some(ns) = fs::read_to_string(&file)
                    .ok()
                    .and_then(|s| s.trim().parse::<u64>().ok())
                {
                    return Some(Duration::from_nanos(ns));
                }
            }
        }
    }
    let unified = cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .filter(|p| *p != "/")?;
    for root in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
        if let Some(us) = fs::read_to_string(format!("{root}{unified}/cpu.stat"))
            .ok()
            .and_then(|s| usage_usec(&s))
        {
            return Some(Duration::from_micros(us));
        }
    }
    None
}

fn usage_usec(cpu_stat: &str) -> Option<u64> {
    cpu_stat
        .lines()
        .find_map(|l| l.strip_prefix("usage_usec "))
        .and_then(|v| v.trim().parse().ok())
}

/// The CPU time used so far by process `pid` alone (all its threads, not its cgroup: the
/// agent shares its container with Envoy, and its own looks must not count as Envoy's):
/// the threads' `schedstat` (nanoseconds), else `utime + stime` of `/proc/PID/stat` (clock
/// ticks). None when neither can be read.
pub fn process_cpu_time(pid: u32) -> Option<Duration> {
    threads_cpu_time(pid).or_else(|| {
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat_cpu_time(&stat, clock_ticks_per_second())
    })
}

/// `utime + stime` (fields 14 and 15) of a `/proc/PID/stat` line, `ticks` to the second.
fn stat_cpu_time(stat: &str, ticks: u64) -> Option<Duration> {
    let after = stat.get(stat.rfind(')')? + 1..)?;
    // After the command: state is field 3, so utime (14) and stime (15) are the 12th and 13th.
    let mut fields = after.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    (ticks > 0).then(|| Duration::from_secs_f64((utime + stime) as f64 / ticks as f64))
}

fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf(3) has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(ticks).unwrap_or(100)
}

/// The sum of the on-CPU time of `pid`'s threads (`/proc/PID/task/*/schedstat`, nanoseconds).
fn threads_cpu_time(pid: u32) -> Option<Duration> {
    let tasks = fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut ns = 0u64;
    let mut any = false;
    for task in tasks.filter_map(|t| t.ok()) {
        if let Some(v) = fs::read_to_string(task.path().join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        {
            ns += v;
            any = true;
        }
    }
    any.then(|| Duration::from_nanos(ns))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_state_after_an_awkward_command() {
        assert_eq!(state_of_stat("42 (envoy) S 1 42"), Some('S'));
        assert_eq!(state_of_stat("42 (a) b) T 1 42"), Some('T'));
        assert!(!stopped_by_signal(std::process::id()));
    }

    #[test]
    fn utime_and_stime_are_read_after_an_awkward_command() {
        let stat = "42 (a) b) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 7";
        assert_eq!(stat_cpu_time(stat, 100), Some(Duration::from_secs(3)));
        assert!(process_cpu_time(std::process::id()).is_some());
    }

    #[test]
    fn this_process_uses_cpu() {
        let before = cpu_time(std::process::id()).expect("readable");
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < Duration::from_millis(30) {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        std::hint::black_box(x);
        let after = cpu_time(std::process::id()).unwrap();
        assert!(after > before, "{before:?} → {after:?}");
        assert_eq!(usage_usec("usage_usec 1234\nuser_usec 1000\n"), Some(1234));
    }

    #[test]
    fn a_stopped_process_is_seen_stopped() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        // SAFETY: kill has no memory preconditions; pid is our own child.
        unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !stopped_by_signal(pid) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(stopped_by_signal(pid));
        let _ = child.kill();
        let _ = child.wait();
    }
}
