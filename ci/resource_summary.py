# SPDX-License-Identifier: MIT
"""The build's resource summary from its log (ptxas -v): per arch, per kernel, registers,
spill stores and loads, static shared memory and stack frame; and each TU's compile time.

    python ci/resource_summary.py BUILD_LOG [--markdown] [--update docs/build.md] [--check]

Prints one line per arch and kernel (a markdown table of kernels by arch with --markdown);
--update writes that table into the file's summary section (docs/build.md's, between its
marker comments); --check exits 1 when any kernel spills (the build's rule: no spill on any
arch), and names them. .ci/run prints it after the wheel build.
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
# src/kda/prepare.cuh K1Variant; FlashKDA's (kBounded, the default) is left unnamed, as the
# launch record (flash_kda.testing.launched) names K1.
K1_VARIANTS = (None, "K1Variant::kBoundedForms", "K1Variant::kUnbounded")
K1_PLACEMENTS = (None, "K1Place::kLeaving")  # prepare.cuh K1Place; kBeside unnamed
GATE_LOADS = (None, "GateLoad::kBeforeWait")  # prepare.cuh GateLoad; kWithDecays unnamed
NAMED = {"K1Variant": K1_VARIANTS, "K1Place": K1_PLACEMENTS, "GateLoad": GATE_LOADS}


def _template_args(mangled):
    """The template arguments of a flash_kda kernel's mangled name, as written in the source."""
    args = []
    pattern = r"L(i|NS_8PassCodeE|NS_11RecordOrderE|NS\d*_9K1VariantE|NS\d*_7K1PlaceE|NS\d*_8GateLoadE|b)(\d+)E"
    for kind, value in re.findall(pattern, mangled):
        enum = next((e for e in NAMED if e in kind), None)
        if enum:
            named = NAMED[enum][int(value)]
            if named:
                args.append(named)
        elif kind == "i":
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


def table(kernels):
    """One line per (arch, kernel): registers, spill stores and loads, static smem, stack."""
    return [f"{k['arch']}  {k['kernel']}  {k['registers']} registers  {k['spill_stores']} / {k['spill_loads']} "
            f"bytes spilled (stores / loads)  {k['smem']} bytes static smem  {k['stack']} bytes stack"
            for k in rows(kernels)]  # fmt: skip


def markdown(kernels, tus):
    """docs/build.md's table: one row per kernel, a column per arch (registers; spilled bytes
    where any), its static shared memory; then the TUs' compile times."""
    arches = sorted({k["arch"] for k in kernels}, key=lambda a: int(re.sub(r"\D", "", a)))
    cells = {(k["arch"], k["kernel"]): k for k in rows(kernels)}
    names = sorted({k["kernel"] for k in kernels})
    out = ["| kernel | " + " | ".join(arches) + " | static smem (B) |", "|---|" + "---:|" * (len(arches) + 1)]
    for name in names:
        row = []
        for arch in arches:
            k = cells.get((arch, name))
            if k is None:
                row.append("")
            else:
                spill = k["spill_stores"] + k["spill_loads"]
                row.append(f"{k['registers']}" + (f" (spills {k['spill_stores']} B)" if spill else ""))
        smem = max(k["smem"] for k in rows(kernels) if k["kernel"] == name)
        out.append(f"| `{name}` | " + " | ".join(row) + f" | {smem} |")
    spilled = sum(1 for k in rows(kernels) if k["spill_stores"] or k["spill_loads"])
    out.append("")
    times = ", ".join(f"{tu} {sec} s" for tu, sec in tus)
    out.append(f"Registers a thread (ptxas -v); {len(rows(kernels))} kernels on {len(arches)} arches, "
               f"{spilled} with spills. Compile time a TU: {times}.")  # fmt: skip
    return out


BEGIN, END = "<!-- resource summary: begin (ci/resource_summary.py) -->", "<!-- resource summary: end -->"


def update(path, lines):
    """Replace the text between BEGIN and END in the file at `path` with `lines`."""
    with open(path) as f:
        text = f.read()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{path}: no {BEGIN!r} ... {END!r} section")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    with open(path, "w") as f:
        f.write(head + BEGIN + "\n" + "\n".join(lines) + "\n" + END + tail)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("log", help="the build log (ptxas -v output included)")
    parser.add_argument("--markdown", action="store_true", help="the markdown table (docs/build.md's)")
    parser.add_argument("--update", metavar="FILE", help="write the markdown table into FILE's summary section")
    parser.add_argument("--check", action="store_true", help="exit 1 when a kernel spills")
    args = parser.parse_args(argv)
    with open(args.log, errors="replace") as f:
        kernels, tus = parse(f)
    if not kernels:
        print(f"{args.log}: no ptxas -v output (was the build verbose?)", file=sys.stderr)
        return 1
    if args.update:
        update(args.update, markdown(kernels, tus))
    print("\n".join(markdown(kernels, tus) if args.markdown else table(kernels)))
    if not args.markdown:
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
