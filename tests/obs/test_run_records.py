"""test_run_records.py - what a run leaves to look at, from one 4-rank MoE
pipeline run (tiny-moe, pp 2 x dp 2, ep 2, 4 steps, --trace-steps 2:3):

  header   the first metrics row holds the run's settings and environment
           (model, layout, batch, LR, versions, host); the step rows follow;
  tensorboard  a reader written here from the format's description (TFRecord
           framing with both CRC-32Cs checked, the Event and Summary protocol
           buffers) and TensorBoard's own EventAccumulator (the `tensorboard`
           package) each read every number of every step row back, as the
           float the JSONL holds: loss, LR, grad norm, tokens/s, MFU, memory,
           bytes per group and op, the bubble, per-expert load;
  report   `loom report` writes one HTML page whose embedded data are the
           JSONL rows and whose SVG lines pass through the run's values (each
           series' points ordered as its values); headless Chromium (Debian's
           chromium; scripts/setup.sh installs it) loads it, its DOM has every chart, and a
           screenshot is kept beside the test (report.png); bad input exits
           64/65/66 and writes no page;
  trace    --trace writes one trace.json for the whole job: Python's json
           loads it, every rank is a process, every event is of a traced step,
           every pipeline receive ends after its send starts on the aligned
           clocks, and the ping-pong offsets are printed and recorded.

    test_run_records.py ARTEFACT_DIR
"""
import glob
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from html.parser import HTMLParser

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import loomtest as lt  # noqa: E402

F32 = lambda x: struct.unpack("f", struct.pack("f", x))[0]  # noqa: E731


def leaves(node, path=""):
    """(tag, number) of every number under a JSON object, as loom_tboard_add_json names them."""
    items = node.items() if isinstance(node, dict) else enumerate(node)
    for k, v in items:
        tag = "%s%s%s" % (path, "/" if path else "", k)
        if isinstance(v, bool):
            continue
        if isinstance(v, (int, float)):
            yield tag, v
        elif isinstance(v, (dict, list)):
            yield from leaves(v, tag)


def check_header(rows):
    h = rows[0]
    lt.check("run" in h and "env" in h and "loss" not in h, "first row is the header: %s" % list(h))
    run, env = h.get("run", {}), h.get("env", {})
    lt.check(run.get("model", {}).get("name") == "tiny-moe", "header model: %s" % run.get("model"))
    lay = run.get("layout", {})
    lt.check((lay.get("dp"), lay.get("pp"), lay.get("ep"), lay.get("world")) == (2, 2, 2, 4), "header layout %s" % lay)
    lt.check(run.get("batch") == 8 and run.get("seq") == 32 and run.get("lr") == 0.001 and run.get("steps") == 4,
             "header batch/seq/lr/steps: %s" % {k: run.get(k) for k in ("batch", "seq", "lr", "steps")})
    for k in ("loom", "commit", "compiler", "mpi", "blas", "host", "cpu"):
        lt.check(env.get(k), "header env names %s" % k)
    lt.check([r["step"] for r in rows[1:]] == [1, 2, 3, 4], "4 step rows after the header")


def crc32c(data):
    """CRC-32C (Castagnoli, reflected 0x82F63B78), bit by bit."""
    c = 0xFFFFFFFF
    for b in data:
        c ^= b
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    return c ^ 0xFFFFFFFF


def masked(c):
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def varint(b, i):
    v = shift = 0
    while True:
        v |= (b[i] & 0x7F) << shift
        shift += 7
        i += 1
        if b[i - 1] < 0x80:
            return v, i


def fields(b):
    """(field, value) of a protocol buffer message: ints, 8/4-byte blobs, bytes."""
    i, out = 0, []
    while i < len(b):
        key, i = varint(b, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            v, i = varint(b, i)
        elif wire == 1:
            v, i = b[i:i + 8], i + 8
        elif wire == 5:
            v, i = b[i:i + 4], i + 4
        elif wire == 2:
            n, i = varint(b, i)
            v, i = b[i:i + n], i + n
        else:
            raise ValueError("wire type %d" % wire)
        out.append((field, v))
    return out


def read_events(path):
    """The file's records (TFRecord framing, both CRCs checked) as Events:
    [(step, wall_time, file_version or None, {tag: simple_value})]."""
    data, i, events = open(path, "rb").read(), 0, []
    while i < len(data):
        head = data[i:i + 8]
        (n,), (hcrc,) = struct.unpack("<Q", head), struct.unpack("<I", data[i + 8:i + 12])
        lt.check(masked(crc32c(head)) == hcrc, "record at byte %d: length CRC" % i)
        payload = data[i + 12:i + 12 + n]
        (pcrc,) = struct.unpack("<I", data[i + 12 + n:i + 16 + n])
        lt.check(len(payload) == n and masked(crc32c(payload)) == pcrc, "record at byte %d: payload CRC" % i)
        i += 16 + n
        step, wall, version, scalars = 0, None, None, {}
        for f, v in fields(payload):
            if f == 1:
                wall = struct.unpack("<d", v)[0]
            elif f == 2:
                step = v
            elif f == 3:
                version = v.decode()
            elif f == 5:
                for vf, value in fields(v):
                    if vf == 1:
                        kv = dict(fields(value))
                        scalars[kv[1].decode()] = struct.unpack("<f", kv[2])[0]
        events.append((step, wall, version, scalars))
    return events


def check_tensorboard(tbdir, steps):
    files = glob.glob(os.path.join(tbdir, "events.out.tfevents.*"))
    lt.check(len(files) == 1, "one event file: %s" % files)
    # an independent reader of the format first: framing, CRCs and the protocol buffers
    events = read_events(files[0])
    lt.check(events[0][2] == "brain.Event:2" and [e[0] for e in events[1:]] == [r["step"] for r in steps],
             "records: the version, then one event per step: %s" % [e[0] for e in events])
    mine = [(tag, v) for row in steps for tag, v in leaves(row) if tag != "step"]
    got = [(tag, e[3].get(tag)) for row, e in zip(steps, events[1:]) for tag, _ in leaves(row) if tag != "step"]
    lt.check(got == [(tag, F32(v)) for tag, v in mine], "independent reader: every JSONL number, as a float")
    # then TensorBoard's own reader (scripts/setup.sh installs the package)
    try:
        from tensorboard.backend.event_processing import event_accumulator as ea
    except ImportError:
        lt.check(False, "the tensorboard package is not installed (scripts/setup.sh installs it)")
        return
    acc = ea.EventAccumulator(files[0], size_guidance={ea.SCALARS: 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for want in ("loss", "lr", "grad_norm", "tokens_per_s", "mfu", "mem/peak_rss", "mem/activations", "pp_bubble",
                 "comm/pp/send/bytes", "comm/dp/allreduce/bytes", "moe/0/tokens/0", "moe/0/imbalance"):
        lt.check(want in tags, "TensorBoard has %s" % want)
    n = bad = 0
    for row in steps:
        for tag, v in leaves(row):
            if tag == "step":
                continue
            got = [e.value for e in acc.Scalars(tag) if e.step == row["step"]] if tag in tags else []
            n += 1
            if got != [F32(v)]:
                bad += 1
                if bad < 5:
                    print("tensorboard %s at step %d: %s, JSONL %r" % (tag, row["step"], got, v))
    lt.check(bad == 0 and n > 100, "every JSONL number read back from TensorBoard (%d of %d differ)" % (bad, n))


class Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.svgs, self.lines, self.data, self._in_data, self.rects = [], {}, "", False, 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "svg":
            self.svgs.append(a.get("id"))
        if tag == "polyline":
            self.lines.setdefault(self.svgs[-1], {})[a["data-series"]] = (a["points"], a["data-values"])
        if tag == "rect" and a.get("class") == "span":
            self.rects += 1
        self._in_data = tag == "script" and a.get("id") == "loom-data"

    def handle_data(self, data):
        if self._in_data:
            self.data += data

    def handle_endtag(self, tag):
        self._in_data = False


def check_series(page, chart, name, values):
    points, data = page.lines.get(chart, {}).get(name, ("", ""))
    ys = [float(p.split(",")[1]) for p in points.split()]
    got = [float(x) for x in data.split()]
    lt.check(got == values, "%s/%s data-values %s, JSONL %s" % (chart, name, got, values))
    lt.check(len(ys) == len(values), "%s/%s has a point per step" % (chart, name))
    order = all((values[i] - values[j]) * (ys[i] - ys[j]) <= 1e-9 for i in range(len(ys)) for j in range(len(ys)))
    lt.check(order, "%s/%s: higher values are drawn higher: %s vs %s" % (chart, name, ys, values))


def check_report(work, metrics, trace, rows, art):
    out = os.path.join(work, "report.html")
    lt.run(["report", metrics, "-o", out, "--trace", trace])
    html = open(out).read()
    lt.check("http" not in re.sub(r"xmlns=\"http://www.w3.org/2000/svg\"|https://ui.perfetto.dev", "", html),
             "the page loads nothing from the network")
    page = Page()
    page.feed(html)
    data = json.loads(page.data)
    lt.check(data.get("header") == rows[0] and data.get("steps") == rows[1:], "the page embeds the JSONL rows")
    for chart in ("loss", "throughput", "memory", "comm", "bubble", "timeline", "moe_imbalance", "moe_tokens"):
        lt.check(chart in page.svgs, "the page has chart %s: %s" % (chart, page.svgs))
    steps = rows[1:]
    check_series(page, "loss", "loss", [r["loss"] for r in steps])
    check_series(page, "loss", "lr", [r["lr"] for r in steps])
    check_series(page, "throughput", "tokens_per_s", [r["tokens_per_s"] for r in steps])
    check_series(page, "memory", "mem/peak_rss", [r["mem"]["peak_rss"] for r in steps])
    check_series(page, "bubble", "pp_bubble", [r["pp_bubble"] for r in steps])
    check_series(page, "comm", "comm/pp/send/bytes", [r["comm"]["pp"]["send"]["bytes"] for r in steps])
    lt.check(page.rects > 10, "the timeline has the traced actions (%d spans)" % page.rects)
    shutil.copy(out, os.path.join(art, "report.html"))
    chromium = shutil.which("chromium")
    if not chromium:
        lt.check(False, "Debian's chromium is not installed (scripts/setup.sh installs it)")
        return
    url = "file://" + out
    base = [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
            "--user-data-dir=" + os.path.join(work, "chrome"), "--window-size=1000,3600"]
    dom = subprocess.run(base + ["--dump-dom", url], capture_output=True, text=True, timeout=120)
    lt.check(dom.returncode == 0 and dom.stdout.count("<polyline") == html.count("<polyline") and
             "loom-data" in dom.stdout, "chromium loads the page with every chart (rc %d)" % dom.returncode)
    shot = os.path.join(art, "report.png")
    p = subprocess.run(base + ["--screenshot=" + shot, url], capture_output=True, text=True, timeout=120)
    lt.check(p.returncode == 0 and os.path.exists(shot) and os.path.getsize(shot) > 20000,
             "chromium screenshot %s (rc %d)" % (shot, p.returncode))
    print("report rendered by chromium -> %s" % shot)


def check_report_errors(work):
    bad = os.path.join(work, "bad.jsonl")
    with open(bad, "w") as f:
        f.write('{"step": 1, "loss": 2.5}\nnot json\n')
    for args, rc, why in (([], 64, "needs RUN.jsonl"), ([os.path.join(work, "none.jsonl")], 66, "none.jsonl"),
                          ([bad], 65, "line 2")):
        p = lt.run(["report"] + args, check_ok=False)
        lt.check(p.returncode == rc and why in p.stderr, "loom report %s: exit %d saying %r (%d: %s)" % (
            args, rc, why, p.returncode, p.stderr.strip()[-200:]))
    lt.check(not os.path.exists(os.path.join(work, "bad.html")), "a failed report writes no page")


def check_trace(trace, out):
    d = json.load(open(trace))
    ev = d["traceEvents"]
    coords = {}
    for e in ev:
        if e.get("ph") == "M" and e["name"] == "process_name":
            m = re.search(r"tp (\d+) cp (\d+) dp (\d+) pp (\d+)", e["args"]["name"])
            coords[e["pid"]] = tuple(map(int, m.groups()))
    lt.check(sorted(coords) == [0, 1, 2, 3], "every rank is a process: %s" % sorted(coords))
    xs = [e for e in ev if e.get("ph") == "X"]
    lt.check({e["args"]["step"] for e in xs} == {2, 3}, "events of steps 2 and 3 only")
    threads = {(e["pid"], e["args"]["name"]) for e in ev if e.get("ph") == "M" and e["name"] == "thread_name"}
    lt.check((0, "pipeline") in threads and (0, "comm pp") in threads, "rows per stream: %s" % sorted(threads)[:4])

    def world(pid, pp_rank):
        t, c, dp, _ = coords[pid]
        return [q for q, v in coords.items() if v == (t, c, dp, pp_rank)][0]

    sends, recvs = {}, {}
    for e in xs:
        m = re.match(r"(SEND|RECV)_(ACT|GRAD) mb (\d+) chunk \d+ (?:->|from) rank (\d+)", e["name"])
        if m:
            io, kind, mb, peer = m.groups()
            key = (e["args"]["step"], kind, int(mb))
            if io == "SEND":
                sends[key + (e["pid"], world(e["pid"], int(peer)))] = e
            else:
                recvs[key + (world(e["pid"], int(peer)), e["pid"])] = e
    lt.check(len(recvs) == 16 and set(recvs) == set(sends), "16 matched sends and receives: %d, %d" %
             (len(sends), len(recvs)))
    margin = {k: r["ts"] + r["dur"] - sends[k]["ts"] for k, r in recvs.items() if k in sends}
    late = [(k, round(m, 1)) for k, m in margin.items() if m < 0]
    lt.check(margin and not late, "every receive ends after its send starts: %s" % late)
    if margin:
        print("receive end - send start: min %.1f us over %d pairs" % (min(margin.values()), len(margin)))
    offs = d.get("otherData", {}).get("clock_offsets_us", [])
    lt.check(len(offs) == 4 and offs[0] == 0, "clock offsets recorded: %s" % offs)
    lt.check(re.search(r"trace: rank clocks aligned to rank 0 by ping-pong.*rank 3 [-+]\d", out) is not None,
             "offsets printed")
    print("clock offsets (us):", offs, "round trips:", d["otherData"].get("clock_rtt_us"))
    for r in range(4):  # loom sim --from-trace's input: each rank's last traced step
        steps = {e.get("args", {}).get("step") for e in json.load(open(os.path.join(os.path.dirname(trace),
                                                                           "trace_rank%d.json" % r)))["traceEvents"]
                 if e.get("ph") == "X"}
        lt.check(steps == {None}, "trace_rank%d.json: one step's events (%s)" % (r, steps))


def check_trace_steps_usage(data):
    base = ["train", "--data", data, "--model", "tiny", "--steps", "4", "--batch", "2", "--seq", "16"]
    for bad, why in ((["--trace-steps", "2:3"], "needs --trace"), (["--trace", "x", "--trace-steps", "3:5"], "<= --steps 4"),
                     (["--trace", "x", "--trace-steps", "3:2"], "expected A:B"), (["--trace", "x", "--trace-steps", "a"], "expected")):
        p = lt.run(base + bad, check_ok=False)
        lt.check(p.returncode == 64 and why in p.stderr, "%s: exit 64 saying %r (%d: %s)" % (bad, why, p.returncode,
                                                                                            p.stderr.strip()[-200:]))


def main():
    art = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else tempfile.mkdtemp()
    os.makedirs(art, exist_ok=True)
    work = tempfile.mkdtemp(prefix="loom-records-")
    data = lt.make_text_data(work)
    metrics, tb, trace = (os.path.join(work, n) for n in ("m.jsonl", "tb", "tr"))
    p = lt.run(["train", "--model", "tiny-moe", "--data", data, "--steps", "4", "--batch", "8", "--seq", "32",
                "--lr", "1e-3", "--pp", "2", "--dp", "2", "--ep", "2", "--micro-batches", "2", "--peak-flops", "1e9",
                "--metrics", metrics, "--tensorboard", tb, "--trace", trace, "--trace-steps", "2:3"], np=4)
    rows = [json.loads(line) for line in open(metrics) if line.strip()]
    check_header(rows)
    check_tensorboard(tb, rows[1:])
    check_trace(os.path.join(trace, "trace.json"), p.stdout + p.stderr)
    check_report(work, metrics, os.path.join(trace, "trace.json"), rows, art)
    check_report_errors(work)
    shutil.rmtree(work, ignore_errors=True)
    lt.done()


if __name__ == "__main__":
    main()
