#!/usr/bin/env python3
"""loom across emulated hosts (scripts/cluster, docs/cluster.md): two hosts,
each a network namespace with its own hostname, joined by a bridge.

- dp=2 x tp=2 and pp=2 x dp=2 under `cluster run` (mpirun with a hostfile,
  two ranks a host) and under `cluster srun` (Slurm, PMIx; also with
  --distribution=cyclic, which alternates the nodes) train
  the same model as one rank (loss at each step and every final parameter
  within 1e-5) and as the same layout on one host, bit for bit;
- Open MPI's own log (btl_base_verbose) shows shared memory (vader) between
  ranks on one host and TCP between hosts, and both are used;
- under `mpirun --map-by node` (the launcher alternates hosts) loom places
  its ranks host by host, so the default order keeps TP inside a host: the
  start-up table says which ranks share a host, the run matches one rank, and
  the bytes that crossed the link (the kernel's counters on host 0's eth0, not
  loom's) are under half of those with LOOM_PLACEMENT=launcher (TP across);
- dp=4 (two ranks a host) with LOOM_DP_ALLREDUCE=hier (reduce-scatter in a
  host, all-reduce across, all-gather in a host) matches the flat all-reduce
  and one rank, and fewer bytes cross the link (kernel counters);
- `cluster down` leaves no namespace, mount, state or daemon behind.

Needs root and network namespaces. Without them it prints why and exits 77
(ctest: skipped); under CI (CI=true), which runs as root, a skip is a failure."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import loomtest as lt  # noqa: E402

CLUSTER = os.path.join(lt.SRC, "scripts", "cluster")
COMMON = ["--steps", 4, "--batch", 8, "--seq", 16, "--lr", "1e-3", "--warmup", 1,
          "--seed", 5, "--peak-flops", "1e11", "--no-progress"]


def with_batch(args, b):
    out = list(args)
    out[out.index("--batch") + 1] = b
    return out


def skip(why):
    if os.environ.get("CI") == "true":
        print("FAIL: the cluster test cannot run here: %s (CI runs as root and must run it)" % why)
        sys.exit(1)
    print("SKIPPED: %s" % why)
    sys.exit(77)


def can_run():
    if os.geteuid() != 0:
        skip("not root: emulated hosts need network namespaces (run as root)")
    for tool in ("ip", "tc", "nsenter", "unshare", "mpirun"):
        if shutil.which(tool) is None:
            skip("%s is not installed (scripts/setup.sh installs it)" % tool)
    was_mount = os.path.ismount("/run/netns")
    probe = "loomc-probe-%d" % os.getpid()
    p = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if p.returncode != 0:
        skip("this machine gives no network namespaces (ip netns add: %s)" % p.stderr.strip())
    subprocess.run(["ip", "netns", "delete", probe], check=True)
    if not was_mount and not os.listdir("/run/netns"):  # ip made the mount: undo it
        subprocess.run(["umount", "/run/netns"], check=True)
        os.rmdir("/run/netns")
    return was_mount


def cluster(*args, check=True, env=None):
    cmd = [CLUSTER] + [str(a) for a in args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    if check and p.returncode != 0:
        # Open MPI's transport log (btl_base_verbose) would bury the cause: left out
        out = [ln for ln in (p.stdout + p.stderr).splitlines() if not re.match(r"\[[\w.-]+:\d+\] (mca|btl)", ln)]
        print("command failed (%d): %s\n%s" % (p.returncode, " ".join(cmd), "\n".join(out[-80:])))
        logs = "/run/loomc/slurm"  # what Slurm said, if it was started
        for f in sorted(os.listdir(logs)) if os.path.isdir(logs) else []:
            if f.endswith(".log"):
                with open(os.path.join(logs, f)) as fh:
                    print("--- %s (last lines)\n%s" % (f, "".join(fh.readlines()[-15:])))
        cluster("down", check=False)
        raise SystemExit(1)
    return p


def transports(log, label):
    """Check every 'Using X btl for send to ... on node H' line Open MPI
    printed: vader exactly when sender and receiver share a host, TCP when
    they do not. Returns the (same-host, cross-host) line counts."""
    same = cross = 0
    for m in re.finditer(r"\[([\w.-]+):\d+\] mca: bml: Using (\w+) btl for send to \S+ on node ([\w.-]+)", log):
        sender, btl, dest = m.groups()
        if btl == "self":
            continue
        if sender == dest:
            same += 1
            lt.check(btl == "vader", "%s: %s -> %s used %s, not shared memory (vader)" % (label, sender, dest, btl))
        else:
            cross += 1
            lt.check(btl == "tcp", "%s: %s -> %s used %s, not tcp" % (label, sender, dest, btl))
    lt.check(same > 0 and cross > 0, "%s: Open MPI logged %d same-host and %d cross-host transports; "
             "expected both" % (label, same, cross))
    print("%s: %d same-host pairs on vader, %d cross-host pairs on tcp" % (label, same, cross))
    return same, cross


def identical(ref, run, label):
    """Same layout, one host vs two: the losses and the parameter files equal, bit for bit."""
    la = [(r["step"], r["loss"]) for r in lt.read_metrics(ref[0])]
    lb = [(r["step"], r["loss"]) for r in lt.read_metrics(run[0])]
    lt.check(la == lb and len(la) > 0, "%s: losses differ from one host: %s vs %s" % (label, lb, la))
    with open(ref[1], "rb") as a, open(run[1], "rb") as b:
        lt.check(a.read() == b.read(), "%s: final parameters differ from the one-host run" % label)


def train_on(tmp, how, tag, np, args, extra=()):
    """`loom train` through `cluster run` or `cluster srun` on np ranks; the
    metrics and parameters land in tmp (one file system for every host)."""
    m, p = os.path.join(tmp, tag + ".jsonl"), os.path.join(tmp, tag + ".safetensors")
    full = ["train", "--metrics", m, "--save-params", p] + list(args)
    if how == "run":
        out = cluster("run", "-np", np, "--mca", "btl_base_verbose", 100, *extra, lt.LOOM, *full)
    else:
        env = dict(os.environ, OMPI_MCA_btl_base_verbose="100")
        out = cluster("srun", "-N", 2, "-n", np, *extra, lt.LOOM, *full, env=env)
    return (m, p), out.stdout + out.stderr


def link_bytes():
    """Bytes host 0's interface sent plus received, from the kernel."""
    p = subprocess.run(["ip", "-n", "loomc-h0", "-s", "-j", "link", "show", "eth0"], capture_output=True,
                       text=True, check=True)
    st = json.loads(p.stdout)[0]["stats64"]
    return st["tx"]["bytes"] + st["rx"]["bytes"]


def map_by_node(tmp, common, one):
    """dp=2 x tp=2 with the launcher's ranks alternating hosts, placed by host
    (default) and as the launcher numbered them; returns the link bytes of each."""
    flags = ["--dp", 2, "--tp", 2]
    crossed = {}
    for placement in ("host", "launcher"):
        before = link_bytes()
        run, log = train_on(tmp, "run", "node_" + placement, 4, common + flags,
                            extra=["--map-by", "node", "-x", "LOOM_PLACEMENT=" + placement])
        crossed[placement] = link_bytes() - before
        label = "--map-by node, LOOM_PLACEMENT=%s" % placement
        want = {"host": ["host 0 loomc-h0: ranks 0 1 (launcher ranks 0 2)",
                         "host 1 loomc-h1: ranks 2 3 (launcher ranks 1 3)"],
                "launcher": ["host 0 loomc-h0: ranks 0 2", "host 1 loomc-h1: ranks 1 3"]}[placement]
        for line in want:
            lt.check(line in log, "%s: start-up table lacks '%s'" % (label, line))
        lt.compare_runs(one[0], one[1], run[0], run[1], label + " vs one rank")
        print("%s: %d bytes crossed host 0's link" % (label, crossed[placement]))
    lt.check(crossed["host"] * 2 < crossed["launcher"],
             "TP inside a host should halve the bytes between hosts: %d (placed by host) vs %d (launcher order)"
             % (crossed["host"], crossed["launcher"]))


def hierarchical(tmp):
    """dp=4 over 2 hosts, flat vs hierarchical all-reduce of the gradients."""
    sub = os.path.join(tmp, "hier")
    os.makedirs(sub)
    model = lt.write_model(sub, n_layer=2, n_head=4, n_embd=96, vocab_size=253, n_positions=32)
    common = ["--model", model, "--data", os.path.join(tmp, "train.bin")] + COMMON
    one = lt.train(tmp, "hier_one", None, common)
    runs, crossed = {}, {}
    for how in ("flat", "hier"):
        before = link_bytes()
        runs[how], _ = train_on(tmp, "run", "dp4_" + how, 4, common + ["--dp", 4],
                                extra=["-x", "LOOM_DP_ALLREDUCE=" + how])
        crossed[how] = link_bytes() - before
        lt.compare_runs(one[0], one[1], runs[how][0], runs[how][1], "dp=4 on 2 hosts, %s all-reduce vs one rank" % how)
        print("dp=4 %s: %d bytes crossed host 0's link" % (how, crossed[how]))
    lt.compare_runs(runs["flat"][0], runs["flat"][1], runs["hier"][0], runs["hier"][1], "dp=4 hier vs flat")
    if len(sys.argv) > 1:  # test_hier: sums of every count 1..17 (every remainder) vs by hand
        out = cluster("run", "-np", 4, sys.argv[1], check=False)
        lt.check(out.returncode == 0, "test_hier on 2 hosts failed:\n%s%s" % (out.stdout, out.stderr))
        print("test_hier on 2 hosts: " + out.stdout.strip().splitlines()[-1])
    # ring all-reduce: 3 n per host pair on the link; hierarchical: 2 n (n/2 each way per local rank)
    lt.check(crossed["hier"] < 0.85 * crossed["flat"],
             "hierarchical all-reduce sent %d bytes over the link, flat %d" % (crossed["hier"], crossed["flat"]))


def calibrate_hosts(tmp):
    """`loom calibrate --out` across 2 hosts with 100 Mbit/s links (the
    cluster brought up again with the cap) under `--map-by node`: the file
    says 2 nodes of 2 ranks, the link between hosts at most 100 Mbit/s (what
    the kernel lets through) and the one inside a host faster; `loom plan`
    on that file prices TP across hosts above TP inside a host."""
    cluster("up", 2, "--link", "100mbit")
    f = os.path.join(tmp, "calibrated.json")
    cluster("run", "-np", 4, "--map-by", "node", lt.LOOM, "calibrate", "--out", f, "--quiet")
    with open(f) as fh:
        c = json.load(fh)
    lt.check(c["nodes"] == 2 and c["gpus_per_node"] == 2, "calibrate across hosts: nodes %s x gpus_per_node %s, "
             "not 2 x 2" % (c["nodes"], c["gpus_per_node"]))
    inter, intra = c["inter_node"]["bandwidth_gbps"] * 1e9, c["intra_node"]["bandwidth_gbps"] * 1e9
    # the token bucket's 64 kB burst lets a 1 MiB transfer run at most ~7 % over the rate
    lt.check(0 < inter <= 1.1 * 100e6 / 8, "calibrate: %.2f MB/s a rank between hosts over a 100 Mbit/s link"
             % (inter / 1e6))
    lt.check(intra > 2 * 100e6 / 8, "calibrate: %.2f MB/s inside a host, not above the 100 Mbit/s link's"
             % (intra / 1e6))
    lt.check(c.get("collectives") == {}, "calibrate across hosts wrote measured collectives: %s"
             % c.get("collectives"))
    step = {}
    for order in ("tp.cp.dp.pp", "dp.tp.cp.pp"):
        p = subprocess.run([lt.LOOM, "plan", "--model", "mini", "--cluster", f, "--gpus", "4", "--batch", "16",
                            "--seq", "64", "--precision", "fp32", "--layout", "dp=2,tp=2,order=" + order, "--json"],
                           capture_output=True, text=True)
        lt.check(p.returncode == 0, "loom plan on the calibrated file failed: %s" % p.stderr[-500:])
        step[order] = json.loads(p.stdout)["time_s"]["step"] if p.returncode == 0 else 0
    lt.check(step["dp.tp.cp.pp"] > step["tp.cp.dp.pp"] > 0, "loom plan on the calibrated file: TP across hosts "
             "%.3f s a step, TP inside %.3f s" % (step["dp.tp.cp.pp"], step["tp.cp.dp.pp"]))


def left_behind():
    """What of the cluster exists now: namespaces, its state folder, mounts."""
    left = [n for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
            if n.startswith("loomc-")]
    if os.path.exists("/run/loomc"):
        left.append("/run/loomc")
    with open("/proc/self/mountinfo") as f:
        left += [line.split()[4] for line in f if "/run/loomc" in line.split()[4]]
    return left


def daemons():
    """pids of the daemons `cluster srun` started, from their pid files."""
    pids = []
    for d in ("/run/loomc/slurm", "/run/loomc/munge"):
        if os.path.isdir(d):
            for f in os.listdir(d):
                if f.endswith(".pid"):
                    with open(os.path.join(d, f)) as fh:
                        pids.append(int(fh.read().strip()))
    return pids


def running(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def main():
    netns_mount = can_run()
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)
        data = lt.make_text_data(tmp)
        model = lt.write_model(tmp, n_layer=2, n_head=4, n_embd=32, vocab_size=253, n_positions=32)
        common = ["--model", model, "--data", data] + COMMON
        one = lt.train(tmp, "one", None, common)
        one_b32 = lt.train(tmp, "one_b32", None, with_batch(common, 32))
        dptp = ["--dp", 2, "--tp", 2]
        ppdp = ["--pp", 2, "--dp", 2]
        host_dptp = lt.train(tmp, "host_dptp", 4, common + dptp)
        host_ppdp = lt.train(tmp, "host_ppdp", 4, common + ppdp)
        try:
            cluster("up", 2)
            run, log = train_on(tmp, "run", "cl_dptp", 4, common + dptp)
            transports(log, "mpirun dp=2 tp=2")
            lt.compare_runs(one[0], one[1], run[0], run[1], "mpirun dp=2 tp=2 on 2 hosts vs one rank")
            identical(host_dptp, run, "mpirun dp=2 tp=2 on 2 hosts")

            run, log = train_on(tmp, "run", "cl_ppdp", 4, common + ppdp)
            transports(log, "mpirun pp=2 dp=2")
            lt.compare_runs(one[0], one[1], run[0], run[1], "mpirun pp=2 dp=2 on 2 hosts vs one rank")
            identical(host_ppdp, run, "mpirun pp=2 dp=2 on 2 hosts")

            # TP's bytes are 4x DP's here (batch 32 x seq 16 activations vs ~18k parameters)
            map_by_node(tmp, with_batch(common, 32), one_b32)

            hierarchical(tmp)

            run, log = train_on(tmp, "srun", "sr_dptp", 4, common + dptp)
            transports(log, "srun dp=2 tp=2")
            lt.compare_runs(one[0], one[1], run[0], run[1], "srun dp=2 tp=2 on 2 hosts vs one rank")
            identical(host_dptp, run, "srun dp=2 tp=2 on 2 hosts")
            run, log = train_on(tmp, "srun", "sr_ppdp", 4, common + ppdp)
            lt.compare_runs(one[0], one[1], run[0], run[1], "srun pp=2 dp=2 on 2 hosts vs one rank")
            identical(host_ppdp, run, "srun pp=2 dp=2 on 2 hosts")

            # Slurm numbering the ranks round-robin over the nodes: loom still places TP inside a host
            run, log = train_on(tmp, "srun", "sr_cyclic", 4, common + dptp, extra=["--distribution=cyclic"])
            for line in ("host 0 loomc-h0: ranks 0 1 (launcher ranks 0 2)",
                         "host 1 loomc-h1: ranks 2 3 (launcher ranks 1 3)"):
                lt.check(line in log, "srun --distribution=cyclic: start-up table lacks '%s'" % line)
            lt.compare_runs(one[0], one[1], run[0], run[1], "srun --distribution=cyclic dp=2 tp=2 vs one rank")
            identical(host_dptp, run, "srun --distribution=cyclic dp=2 tp=2")
            pids = daemons()
            lt.check(len(pids) == 4, "expected munged, slurmctld and 2 slurmd pid files, found %d" % len(pids))

            calibrate_hosts(tmp)
        finally:
            cluster("down", check=False)
        lt.check(not left_behind(), "cluster down left %s" % left_behind())
        lt.check(os.path.ismount("/run/netns") == netns_mount, "/run/netns was %sa mount point before up, "
                 "and is %s after down" % ("" if netns_mount else "not ", "one" if not netns_mount else "not"))
        lt.check(not [p for p in pids if running(p)], "cluster down left daemons running: %s" %
                 [p for p in pids if running(p)])
        lt.check(cluster("status", check=False).returncode == 1, "cluster status after down says it is up")
    lt.done()


if __name__ == "__main__":
    main()
