"""test_install.py - `cmake --install` into a temporary prefix, then what a
user of the installed loom sees:

  - the files: bin/loom, libloom.so with its versioned soname, libloom.a,
    the public headers (include/loom/*.h, loom.h including every one of them)
    and no internal header, loom.pc, loomConfig.cmake + version file, the
    plan presets, man pages, bash completion;
  - two out-of-tree builds of consumer.c, which calls the public API
    (tokenize, a forward pass, a one-rank training step) and checks the
    results: one with pkg-config against libloom.so, one with
    find_package(loom) against loom::loom_static; both must run;
  - `man -l` renders every page (and groff has no warning), each command's
    page lists the flags its --help lists;
  - the completion script completes commands and a command's flags;
  - the installed loom finds the installed plan presets (--version says where);
  - `cpack -G DEB` makes a Debian package holding the same files under /usr,
    with its dependencies in Depends, and the loom it unpacks runs.

    test_install.py BUILD_DIR
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from loomtest import check, done  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.abspath(os.path.join(HERE, "..", ".."))
COMMANDS = ["train", "eval", "data", "generate", "serve", "export", "sim", "plan", "calibrate", "report"]
ENV = dict(os.environ, OMP_NUM_THREADS="1", MANWIDTH="100", MANPAGER="cat", PAGER="cat")


def sh(cmd, cwd=None, env=ENV, ok=True):
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    if ok and p.returncode != 0:
        print("command failed (%d): %s\n%s%s" % (p.returncode, " ".join(cmd), p.stdout, p.stderr))
        raise SystemExit(1)
    return p


def check_files(prefix):
    for rel in ["bin/loom", "lib/libloom.a", "lib/libloom.so", "include/loom/loom.h", "lib/pkgconfig/loom.pc",
                "lib/cmake/loom/loomConfig.cmake", "lib/cmake/loom/loomConfigVersion.cmake",
                "lib/cmake/loom/loomTargets.cmake", "share/loom/plan/clusters/dgx-h100.json",
                "share/man/man1/loom.1", "share/bash-completion/completions/loom"]:
        check(os.path.exists(os.path.join(prefix, rel)), "installed %s" % rel)
    soname = sh(["objdump", "-p", os.path.join(prefix, "lib", "libloom.so")]).stdout
    check(re.search(r"SONAME\s+libloom\.so\.0\b", soname) is not None, "libloom.so has soname libloom.so.0")
    check(os.path.exists(os.path.join(prefix, "lib", "libloom.so.0")), "libloom.so.0 link installed")
    # the public headers and only them
    installed = sorted(os.path.basename(p) for p in glob.glob(os.path.join(prefix, "include", "loom", "*")))
    public = sorted(os.path.basename(p) for p in glob.glob(os.path.join(SRC, "include", "loom", "*.h")))
    check(installed == public, "include/loom holds the public headers only: %s" % installed)
    check(not glob.glob(os.path.join(prefix, "include", "*.h")), "nothing but include/loom/")
    umbrella = open(os.path.join(prefix, "include", "loom", "loom.h")).read()
    for h in public:
        if h not in ("loom.h", "kernel_list.h"):
            check('#include "loom/%s"' % h in umbrella, "loom.h includes loom/%s" % h)


def build_pkgconfig(prefix, work):
    env = dict(ENV, PKG_CONFIG_PATH=os.path.join(prefix, "lib", "pkgconfig"))
    flags = sh(["pkg-config", "--cflags", "--libs", "loom"], env=env).stdout.split()
    check("-lloom" in flags, "pkg-config --libs loom gives -lloom: %s" % flags)
    static = sh(["pkg-config", "--static", "--libs", "loom"], env=env).stdout
    check("openblas" in static and "cjson" in static, "pkg-config --static lists the dependencies: %s" % static)
    exe = os.path.join(work, "consumer_pc")
    sh(["cc", "-std=c11", "-Wall", "-Werror", os.path.join(HERE, "consumer.c"), "-o", exe] + flags +
       ["-Wl,-rpath," + os.path.join(prefix, "lib"), "-lm"], env=env)
    needed = sh(["objdump", "-p", exe]).stdout
    check("libloom.so.0" in needed, "the pkg-config consumer links libloom.so.0")
    return exe


def build_cmake(prefix, work):
    bdir = os.path.join(work, "cmake-build")
    sh(["cmake", "-S", os.path.join(HERE, "consumer_cmake"), "-B", bdir, "-DCMAKE_BUILD_TYPE=Release",
        "-DCMAKE_PREFIX_PATH=" + prefix, "-DCONSUMER_SOURCE=" + os.path.join(HERE, "consumer.c")])
    sh(["cmake", "--build", bdir])
    return os.path.join(bdir, "consumer")


def run_consumer(exe, what, work):
    d = os.path.join(work, what)
    os.makedirs(d)
    p = sh([exe, d], ok=False)
    check(p.returncode == 0 and "consumer ok" in p.stdout,
          "%s consumer ran (%d):\n%s%s" % (what, p.returncode, p.stdout, p.stderr[-3000:]))
    print(what + ": " + " | ".join(p.stdout.strip().splitlines()))


def check_man(prefix):
    pages = sorted(glob.glob(os.path.join(prefix, "share", "man", "man1", "*.1")))
    names = [os.path.basename(p) for p in pages]
    want = ["loom.1"] + ["loom-%s.1" % c for c in COMMANDS]
    check(sorted(want) == names, "man pages %s, expected %s" % (names, sorted(want)))
    loom = os.path.join(prefix, "bin", "loom")
    for page in pages:
        text = sh(["man", "-l", page]).stdout
        check("NAME" in text and "SYNOPSIS" in text and len(text) > 300, "man -l %s renders" % page)
        warn = sh(["groff", "-man", "-Tutf8", "-ww", "-z", page]).stderr.splitlines()
        # long lines of a preformatted example do not fit 80 columns: not a fault of the page
        warn = [w for w in warn if "cannot adjust line" not in w and "can't break line" not in w]
        check(not warn, "groff warns on %s: %s" % (page, warn))
        cmd = os.path.basename(page)[len("loom-"):-2] if page.endswith(".1") and "-" in os.path.basename(page) else None
        if cmd:
            help_text = sh([loom, cmd, "--help"]).stdout
            flags = re.findall(r"^  (--[a-z0-9-]+)", help_text, re.M)
            plain = text.replace("\u2010", "-").replace("\u2212", "-")
            missing = [f for f in flags if f not in plain]
            check(not missing, "man page of %s lacks flags its --help has: %s" % (cmd, missing))


def check_completion(prefix):
    comp = os.path.join(prefix, "share", "bash-completion", "completions", "loom")

    def complete(*words):
        script = 'source "%s"; COMP_WORDS=(%s); COMP_CWORD=%d; _loom; echo "${COMPREPLY[*]}"' % (
            comp, " ".join("'%s'" % w for w in words), len(words) - 1)
        return sh(["bash", "-c", script]).stdout.split()

    check(complete("loom", "tr") == ["train"], "loom tr<TAB> -> train: %s" % complete("loom", "tr"))
    got = complete("loom", "train", "--save")
    check(sorted(got) == ["--save-dir", "--save-every", "--save-params"], "loom train --save<TAB>: %s" % got)
    check("--tensorboard" in complete("loom", "train", "--tens"), "completion knows --tensorboard")
    check("report" in complete("loom", "re"), "completion knows loom report")


def files_under(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def check_deb(build, prefix, work):
    out = os.path.join(work, "deb")
    sh(["cpack", "-G", "DEB", "-B", out], cwd=build)
    debs = glob.glob(os.path.join(out, "loom_*.deb"))
    check(len(debs) == 1, "cpack -G DEB made one package: %s" % debs)
    if len(debs) != 1:
        return
    fields = {k: sh(["dpkg-deb", "-f", debs[0], k]).stdout.strip() for k in ("Package", "Version", "Depends")}
    check(fields["Package"] == "loom" and fields["Version"] == "0.1.0", "package fields: %s" % fields)
    for dep in ("libopenmpi-dev", "libopenblas-dev", "libcjson-dev", "libmicrohttpd-dev"):
        check(dep in fields["Depends"], "Depends names %s: %s" % (dep, fields["Depends"]))
    root = os.path.join(work, "deb-root")
    sh(["dpkg-deb", "-x", debs[0], root])
    got, want = files_under(os.path.join(root, "usr")), files_under(prefix)
    check(got == want, "the package holds the installed files under /usr: %s" % sorted(set(got) ^ set(want))[:8])
    v = sh([os.path.join(root, "usr", "bin", "loom"), "--version"]).stdout
    check("commit" in v, "the packaged loom runs: %s" % v[:80])


def main():
    build = os.path.abspath(sys.argv[1])
    work = tempfile.mkdtemp(prefix="loom-install-")
    try:
        prefix = os.path.join(work, "prefix")
        sh(["cmake", "--install", build, "--prefix", prefix])
        check_files(prefix)
        v = sh([os.path.join(prefix, "bin", "loom"), "--version"]).stdout
        print(v)
        for key in ["commit", "compiler:", "MPI:", "BLAS:", "CUDA:"]:
            check(key in v, "loom --version names %s" % key)
        check(os.path.join(prefix, "share", "loom", "plan") in v, "the installed loom uses the installed presets")
        run_consumer(build_pkgconfig(prefix, work), "pkg-config", work)
        run_consumer(build_cmake(prefix, work), "find_package", work)
        check_man(prefix)
        check_completion(prefix)
        check_deb(build, prefix, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    done()


if __name__ == "__main__":
    main()
