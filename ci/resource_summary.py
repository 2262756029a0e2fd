# SPDX-License-Identifier: MIT
"""The build's resource summary from its log (ptxas -v): per arch, per kernel, registers,
spill stores and loads, static shared memory and stack frame; and each TU's compile time.

    python ci/resource_summary.py BUILD_LOG [--markdown] [--check]

Prints a table (markdown with --markdown, the form docs/build.md keeps); with --check, exits 1
when any kernel spills (the build's rule: no spill on any arch) and names them. .ci/run prints
it after the wheel build; docs/build.md's table is this script's --markdown output.
"""

import argparse
import re
import sys

ENTRY = re.compile(r"Compiling entry function '(_Z\w+)' for '(sm_\w+)'")
PROPERTIES = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"Used (\d+) registers(?:, used (\d+) barriers)?(?:, (\d+) bytes smem)?")
COMPILED = re.compile(r"flash-kda: (\S+\.cu) compiled in ([\d.]+) s")
PASS_CODES = ("Plain", "General", "States", "Rerun")  # src/kda/config.h PassCode
ORDERS = ("Fragments", "Tiles")  # src/kda/workspace.h RecordOrder


def _template_args(mangled):
    """The template arguments of a flash_kda kernel's mangled name, as written in the source."""
    args = []
    for kind, value in re.findall(r"L(i|NS_8PassCodeE|NS_11RecordOrderE|b)(\d+)E", mangled):
        if kind == "i":
            args.append(value)
        elif kind == "b":
            args.append("true" if value == "1" else "false")
        elif "PassCode" in kind:
            args.append("k" + PASS_CODES[int(value)])
        else:
            args.append("RecordOrder::k" + ORDERS[int(value)])
    return args


def kernel_name(mangled):
    """``recurrence_kernel<1, 4, kPlain, 1>`` for a flash_kda kernel's mangled name
    (``_ZN9flash_kda5sm90a17recurrence_kernelILi1E...``: the namespace, the arch, the name)."""
    names, at = [], 3 if mangled.startswith("_ZN") else len(mangled)
    while len(names) < 3 and at < len(mangled) and mangled[at].isdigit():
        digits = re.match(r"\d+", mangled[at:]).group(0)
        at += len(digits)
        names.append(mangled[at : at + int(digits)])
        at += int(digits)
    if len(names) < 3 or names[0] != "flash_kda":
        return mangled
    args = _template_args(mangled[at:])
    return f"{names[2]}<{', '.join(args)}>" if args else names[2]


def parse(lines):
    """(kernels, tus): kernels as dicts (arch, kernel, registers, spill_stores, spill_loads,
    smem, stack) in log order, tus as (TU, seconds)."""
    kernels, tus, current = [], [], None
    for line in lines:
        entry = ENTRY.search(line)
        if entry:
            current = dict(arch=entry.group(2), kernel=kernel_name(entry.group(1)), registers=0,
                           spill_stores=0, spill_loads=0, smem=0, stack=0)  # fmt: skip
            kernels.append(current)
            continue
        compiled = COMPILED.search(line)
        if compiled:
            tus.append((compiled.group(1), float(compiled.group(2))))
        if current is None:
            continue
        props = PROPERTIES.search(line)
        if props:
            current.update(stack=int(props.group(1)), spill_stores=int(props.group(2)),
                           spill_loads=int(props.group(3)))  # fmt: skip
        used = USED.search(line)
        if used:
            current.update(registers=int(used.group(1)), smem=int(used.group(3) or 0))
            current = None
    return kernels, tus


def rows(kernels):
    """Unique (arch, kernel) rows, sorted by arch then kernel."""
    seen = {}
    for k in kernels:
        seen[(k["arch"], k["kernel"])] = k
    return [seen[key] for key in sorted(seen, key=lambda a: (int(re.sub(r"\D", "", a[0])), a[1]))]


def table(kernels, markdown):
    header = ("arch", "kernel", "registers", "spill stores", "spill loads", "static smem", "stack")
    out = []
    if markdown:
        out += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for k in rows(kernels):
        cells = (k["arch"], f"`{k['kernel']}`" if markdown else k["kernel"], k["registers"], k["spill_stores"],
                 k["spill_loads"], k["smem"], k["stack"])  # fmt: skip
        out.append("| " + " | ".join(map(str, cells)) + " |" if markdown else "  ".join(map(str, cells)))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("log", help="the build log (ptxas -v output included)")
    parser.add_argument("--markdown", action="store_true", help="a markdown table (docs/build.md)")
    parser.add_argument("--check", action="store_true", help="exit 1 when any kernel spills")
    args = parser.parse_args(argv)
    with open(args.log, errors="replace") as f:
        kernels, tus = parse(f)
    if not kernels:
        print(f"{args.log}: no ptxas -v output (was the build verbose?)", file=sys.stderr)
        return 1
    print("\n".join(table(kernels, args.markdown)))
    for tu, seconds in tus:
        print(f"{tu}: compiled in {seconds} s")
    spilled = [k for k in rows(kernels) if k["spill_stores"] or k["spill_loads"]]
    arches = sorted({k["arch"] for k in kernels})
    print(f"{len(rows(kernels))} kernels on {len(arches)} arches ({', '.join(arches)}); {len(spilled)} spill")
    for k in spilled:
        print(f"SPILL: {k['arch']} {k['kernel']}: {k['spill_stores']} bytes stored, {k['spill_loads']} loaded")
    return 1 if args.check and spilled else 0


if __name__ == "__main__":
    sys.exit(main())
