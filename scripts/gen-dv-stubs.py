#!/usr/bin/env python3
"""Generates a "not this device" stub of a direct-verbs provider library (libmlx5.so.1,
libefa.so.1) - or of a library ferroce does not provide yet (librdmacm.so.1) - from the
installed one, for ferroce-run.

Programs such as Debian's perftest and pyverbs link the provider libraries' direct-verbs
entry points (mlx5dv_*, efadv_*). The real libraries need libibverbs' private ABI, so they
cannot load beside ferroce's libibverbs; the stub exports every function of the installed
library with the same symbol versions (the default one and any older ones), and each answers
as the real library does for a device that is not its own: NULL or an error with errno
EOPNOTSUPP, false for "is this device supported".

The return type of each function comes from the library's header (preprocessed with cc -E):
pointers return NULL, int an errno value (the convention of these libraries: 0 or an errno
value), ssize_t and functions returning a file descriptor -1, bool false, unsigned and enum
types 0, void nothing.

usage: gen-dv-stubs.py [--errno NAME] [--int-error errno|minus-one] [--note TEXT]
                       [--implemented FILE.c] LIBRARY HEADER[,HEADER...] OUT.c OUT.map
  e.g. gen-dv-stubs.py /usr/lib/x86_64-linux-gnu/libmlx5.so.1 infiniband/mlx5dv.h mlx5.c mlx5.map

--errno: the errno every stub sets (default EOPNOTSUPP). --int-error: what a function
returning int answers, its errno value (the direct-verbs libraries' convention, default) or
-1 (librdmacm's). --note: printed once on stderr by the first stub called, prefixed with the
library's name, to say why. --implemented: a C file whose functions implement some of the
library's symbols (ferroce's librdmacm): no stub for those, and the version map still binds
each to its version.
"""

import re
import subprocess
import sys


def exported(lib):
    """(name, version, is_default) of every function the library defines."""
    out = subprocess.run(
        ["readelf", "--dyn-syms", "-W", lib], check=True, capture_output=True, text=True
    ).stdout
    syms = []
    for line in out.splitlines():
        f = line.split()
        if len(f) < 8 or f[3] != "FUNC" or f[6] == "UND":
            continue
        name = f[7]
        if "@@" in name:
            n, v = name.split("@@")
            syms.append((n, v, True))
        elif "@" in name:
            n, v = name.split("@")
            syms.append((n, v, False))
    return syms


def versions(lib):
    """Every version node the library defines, in its order."""
    out = subprocess.run(
        ["readelf", "-V", "-W", lib], check=True, capture_output=True, text=True
    ).stdout
    nodes = []
    in_defs = False
    for line in out.splitlines():
        if "Version definition section" in line:
            in_defs = True
            continue
        if "Version needs section" in line:
            in_defs = False
        m = re.search(r"Flags: (\S+).*Name: (\S+)", line) if in_defs else None
        if m and m.group(1) != "BASE":
            nodes.append(m.group(2))
    return nodes


def declarations(headers):
    """Top-level declarations of the preprocessed headers (bodies and structs dropped)."""
    text = subprocess.run(
        ["cc", "-E", "-P", "-"],
        input="".join(f"#include <{h}>\n" for h in headers),
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    decls, cur, depth = [], [], 0
    for ch in text:
        if ch == "{":
            depth += 1
            continue
        if ch == "}":
            depth -= 1
            if depth == 0:
                cur = []
            continue
        if depth:
            continue
        if ch == ";":
            decls.append(" ".join("".join(cur).split()))
            cur = []
        else:
            cur.append(ch)
    return decls


def strip_attributes(s):
    while True:
        i = s.find("__attribute__")
        if i < 0:
            return s
        j = s.index("(", i)
        depth = 0
        for k in range(j, len(s)):
            depth += {"(": 1, ")": -1}.get(s[k], 0)
            if depth == 0:
                break
        s = s[:i] + s[k + 1 :]


def return_type(decls, name):
    pat = re.compile(r"(?<![\w])" + re.escape(name) + r"\s*\(")
    for d in decls:
        m = pat.search(d)
        if not m or d[: m.start()].count("(") != d[: m.start()].count(")"):
            continue
        rt = strip_attributes(d[: m.start()])
        rt = " ".join(w for w in rt.split() if w not in ("extern", "static", "inline", "__extension__"))
        return rt
    return None


def stub(name, rt, fn, err, int_error):
    """C source of one stub named `fn` for `name` returning `rt` (None: undeclared)."""
    if rt is None:
        sys.stderr.write(f"gen-dv-stubs: {name} is not in the header; stubbed as int\n")
        rt = "int"
    set_err = f"say(); errno = {err};"
    if "*" in rt:
        return f"void *{fn}() {{ {set_err} return NULL; }}"
    if rt == "void":
        return f"void {fn}() {{ say(); }}"
    if rt in ("bool", "_Bool"):
        return f"_Bool {fn}() {{ say(); return 0; }}"
    signed = rt in ("int", "long", "ssize_t", "int32_t", "int64_t", "long long")
    if signed and (rt == "ssize_t" or name.endswith("_fd")):
        return f"long {fn}() {{ {set_err} return -1; }}"
    if signed and int_error == "minus-one":
        return f"int {fn}() {{ {set_err} return -1; }}"
    if signed:
        return f"int {fn}() {{ {set_err} return {err}; }}"
    return f"unsigned long long {fn}() {{ {set_err} return 0; }}"


def main():
    args = sys.argv[1:]
    err, int_error, note, implemented = "EOPNOTSUPP", "errno", None, set()
    while args and args[0].startswith("--"):
        if len(args) < 2:
            sys.exit(__doc__)
        opt, val = args[0], args[1]
        args = args[2:]
        if opt == "--errno":
            err = val
        elif opt == "--int-error" and val in ("errno", "minus-one"):
            int_error = val
        elif opt == "--note":
            note = val
        elif opt == "--implemented":
            with open(val) as f:
                # Function definitions at the start of a line: `type name(...) {`.
                implemented = set(
                    re.findall(r"^[A-Za-z_][\w \*]*?\b(\w+)\([^;]*?\)\s*\{", f.read(), re.M | re.S)
                )
        else:
            sys.exit(__doc__)
    if len(args) != 4:
        sys.exit(__doc__)
    lib, header, out_c, out_map = args
    headers = header.split(",")
    syms = exported(lib)
    nodes = versions(lib)
    decls = declarations(headers)
    soname = lib.rsplit("/", 1)[-1]
    c = [
        f"/* Generated by scripts/gen-dv-stubs.py from {lib} and <{header}>: do not edit. */",
        "#include <errno.h>",
        "#include <stddef.h>",
        "#include <stdio.h>",
        "",
    ]
    if note:
        text = (soname + " (ferroce): " + note).replace("\\", "\\\\").replace('"', '\\"')
        c.append(
            "static void say(void) { static int said; int e = errno; if (!said) { said = 1; "
            f'fprintf(stderr, "{text}\\n"); }} errno = e; }}'
        )
    else:
        c.append("static void say(void) { }")
    default = {}
    versioned = {n for n, _, d in syms if not d}
    for name, ver, is_default in sorted(syms):
        rt = return_type(decls, name)
        if name in implemented and is_default and name not in versioned:
            default.setdefault(ver, []).append(name)
            continue
        if is_default and name not in versioned:
            c.append(stub(name, rt, name, err, int_error))
            default.setdefault(ver, []).append(name)
        elif is_default:
            # With older versions beside it, the default one is bound explicitly (@@), as
            # rdma-core's own libraries do; every node naming it lists it.
            fn = f"ferroce_{name}_default"
            c.append(stub(name, rt, fn, err, int_error))
            c.append(f'__asm__(".symver {fn}, {name}@@{ver}");')
            default.setdefault(ver, []).append(name)
        else:
            fn = f"ferroce_{name}_{ver.replace('.', '_')}"
            c.append(stub(name, rt, fn, err, int_error))
            c.append(f'__asm__(".symver {fn}, {name}@{ver}");')
            # The node must name it too, or `local: *` hides the versioned alias.
            default.setdefault(ver, []).append(name)
    lines = []
    prev = None
    for i, v in enumerate(nodes):
        body = " ".join(f"{n};" for n in default.get(v, []))
        glob = f"global: {body} " if body else ""
        local = "local: *; " if i == 0 else ""
        lines.append(f"{v} {{ {glob}{local}}}{' ' + prev if prev else ''};")
        prev = v
    with open(out_c, "w") as f:
        f.write("\n".join(c) + "\n")
    with open(out_map, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
