"""Figure and table: the FedProx paper's Synthetic comparison, training loss against rounds per setting and method.

    dane figures fedprox_synthetic [--json results/bench.json] [--out results/figures]
        [--page docs/benchmarks.md] [--block table|long] [--print]

Reads the section ``fedprox_synthetic`` of scripts/bench_fedprox_synthetic.py's JSON (every run's training
objective at every round; it never trains) and draws one panel per setting (Synthetic-IID, (0,0), (0.5,0.5),
(1,1)), one line per method, as the paper's Figure 2 (Li et al., MLSys 2020) draws FedAvg and FedProx.  The
table, written between docs/benchmarks.md's ``<!-- fedprox-synthetic-table:begin -->`` and ``...:end -->``
lines (``--block long``: ``fedprox-synthetic-long-table``, a run with more local steps; ``--print``: to
stdout), gives per setting and method the last training objective and its rises (the sum of the round-to-round
increases, `rises`: 0 for a loss that never goes up), then what each run spent by its last round (`spent`: the
sampled clients' uplink and downlink bits, local passes, HVPs, Hessians, factorizations; a count the JSON's run
lacks is "not recorded in this evidence"), then the paper's claims (`CLAIMS`), each judged from the numbers.  The
caption and the figure's title give K as the most local steps a solve takes (S-DANE's stops once its accuracy test
holds) and the local passes per sampled client and round each run made (`passes_text`).  No number is typed by
hand: rerun the benchmark, then this.  Beside the figure (``fedprox_synthetic``,
``--block long``: ``fedprox_synthetic_long``), NAME.md holds the table and NAME.json the sidecar naming the JSON
read (`figure`: what `make_all` draws from paper_figs/evidence/, the page untouched).
"""
from __future__ import annotations

from pathlib import Path

from dane.paper_figs.blocks import SECOND_ORDER, count, method_label, publish
from dane.paper_figs.common import bench_figure, bench_parser
from dane.paper_figs.provenance import bench_section, commits_text

KEY = "fedprox_synthetic"
BEGIN, END = "<!-- fedprox-synthetic-table:begin -->", "<!-- fedprox-synthetic-table:end -->"
#: --block -> the page's markers: the comparison, and the probe at the paper's count of local updates
BLOCKS = {"table": (BEGIN, END),
          "long": ("<!-- fedprox-synthetic-long-table:begin -->", "<!-- fedprox-synthetic-long-table:end -->")}
PAGE = Path("docs") / "benchmarks.md"
TITLES = {"synthetic_iid": "Synthetic-IID", "synthetic_0_0": "Synthetic(0,0)",
          "synthetic_0.5_0.5": "Synthetic(0.5,0.5)", "synthetic_1_1": "Synthetic(1,1)"}
SIMILAR = 0.1  # "similar" final losses: within 10% of the larger
#: a count a run of the JSON does not hold (it predates the key)
UNRECORDED = "not recorded in this evidence"
#: what `spent` shows beside the rounds: the run's key -> its column (bytes shown as bits)
SPENT = {"uplink_bytes": "uplink bits", "downlink_bytes": "downlink bits", "local_passes": "local passes",
         **SECOND_ORDER}


def num(x: float, digits: int = 4) -> str:
    """``x`` to ``digits`` significant digits; one in [0.9, 1) in e-notation (tests/doc_blocks.py reads 0.9xx on a
    page as a typed accuracy)."""
    text = f"{x:.{digits}g}"
    return f"{x:.{digits - 1}e}" if text.startswith("0.9") else text


def label(run: dict) -> str:
    mu = run["keys"].get("mu")
    return method_label(run["method"]) + (f" μ={mu:g}" if mu else "")


def rises(objective: list[float]) -> float:
    """Σ_t max(0, f_{t+1} − f_t): how much a training loss goes up on its way (0 when it only falls)."""
    return sum(max(0.0, b - a) for a, b in zip(objective, objective[1:]))


def by_setting(section: dict) -> dict[str, dict[str, dict]]:
    """setting -> method -> run, settings in the paper's order."""
    out: dict[str, dict[str, dict]] = {}
    for run in section["runs"]:
        out.setdefault(run["setting"], {})[run["method"]] = run
    return {s: out[s] for s in TITLES if s in out}


def stabler(runs: dict[str, dict]) -> tuple[bool, str]:
    """FedProx's loss rises no more than FedAvg's."""
    fa, fp = runs["fedavg"]["objective"], runs["fedprox"]["objective"]
    return rises(fp) <= rises(fa), f"FedProx rises {num(rises(fp), 3)}, FedAvg {num(rises(fa), 3)}"


def lower(runs: dict[str, dict]) -> tuple[bool, str]:
    """FedProx ends no higher than FedAvg."""
    fa, fp = runs["fedavg"]["objective"], runs["fedprox"]["objective"]
    return fp[-1] <= fa[-1], f"FedProx ends at {num(fp[-1])}, FedAvg at {num(fa[-1])}"


def similar(runs: dict[str, dict]) -> tuple[bool, str]:
    """Both fall, and their last losses are within `SIMILAR` of the larger."""
    fa, fp = runs["fedavg"]["objective"], runs["fedprox"]["objective"]
    gap = abs(fa[-1] - fp[-1]) / max(fa[-1], fp[-1])
    ok = fa[-1] < fa[0] and fp[-1] < fp[0] and gap <= SIMILAR
    return ok, (f"FedAvg ends at {num(fa[-1])}, FedProx at {num(fp[-1])} (gap {num(100 * gap, 2)}% of the larger, "
                f"from {num(fa[0])})")


#: (setting, the paper's claim, its test on that setting's runs)
CLAIMS = (("synthetic_1_1", "FedProx μ = 1 is stabler than FedAvg on the most heterogeneous data (its loss rises no "
           "more)", stabler),
          ("synthetic_1_1", "FedProx μ = 1 reaches a lower training loss than FedAvg there (ends no higher)", lower),
          ("synthetic_0.5_0.5", "FedProx μ = 1 is stabler than FedAvg on heterogeneous data (rises no more)", stabler),
          ("synthetic_0.5_0.5", "FedProx μ = 1 ends no higher than FedAvg there", lower),
          ("synthetic_iid", f"on IID data FedAvg and FedProx μ = 1 behave alike (both fall; last losses within "
           f"{SIMILAR:.0%})", similar))


def claims(settings: dict[str, dict[str, dict]]) -> list[str]:
    lines = []
    for setting, claim, test in CLAIMS:
        runs = settings.get(setting, {})
        if "fedavg" in runs and "fedprox" in runs:
            ok, numbers = test(runs)
            lines.append(f"- {TITLES[setting]}: the paper: {claim}. Here: {'agrees' if ok else 'does not agree'}; "
                         f"{numbers}.")
    return lines


def cell(run: dict) -> str:
    """The last objective (its rises), and how the run ended where it did not run all its rounds."""
    text = f"{num(run['objective'][-1])} ({num(rises(run['objective']), 3)})"
    return text if run["status"] == "max_rounds" else f"{text}, {run['status']} at round {run['rounds']}"


def codes(section: dict) -> list[dict | None]:
    """Each run's code record (its ``code``; None for a run of old, which recorded none)."""
    return [run.get("code") for run in section["runs"]]


def per_round(run: dict) -> float | None:
    """The run's local passes per sampled client and round: ``local_passes`` (summed over the clients, to its last
    record) / (rounds x clients sampled a round); None where the JSON holds no passes or no round ran."""
    passes, rounds = run.get("local_passes"), run["rounds"]
    return None if passes is None or not rounds else passes / (rounds * run["keys"]["clients_per_round"])


def passes_text(section: dict) -> str:
    """The local passes per sampled client and round (`per_round`), as the JSON's runs made them: one number for the
    methods that made the same in every setting, a method's own per setting where they differ."""
    settings = by_setting(section)
    made: dict[str, dict[str, float | None]] = {}
    for setting, runs in settings.items():
        for method, run in runs.items():
            made.setdefault(label(run), {})[setting] = per_round(run)
    same: dict[str, list[str]] = {}
    parts = []
    for name, values in made.items():
        if len(set(values.values())) == 1:
            same.setdefault(UNRECORDED if None in values.values() else f"{next(iter(values.values())):.3g}",
                            []).append(name)
        else:
            parts.append(f"{name} " + ", ".join(f"{UNRECORDED if v is None else f'{v:.3g}'} on {TITLES[s]}"
                                               for s, v in values.items()))
    return "; ".join([*(f"{', '.join(names)} {value}" for value, names in same.items()), *parts])


def what_ran(section: dict) -> str:
    """The local solve as it ran: at most K full-gradient steps (S-DANE's stopping once its accuracy test holds),
    then the passes per sampled client and round the JSON records (`passes_text`)."""
    local, methods = section["local"], {run["method"] for run in section["runs"]}
    stops = " (S-DANE's stopping once its accuracy test holds)" if "sdane" in methods else ""
    return (f"every local solve at most K = {local['local_steps']} full-gradient steps at lr {local['lr']:g}{stops}; "
            f"local passes (full local gradients: the steps' and any other the round takes) per sampled client and "
            f"round: {passes_text(section)}")


def spent(settings: dict[str, dict[str, dict]]) -> list[str]:
    """Per setting and method, what the run spent by its last record (summed over the sampled clients): the rounds,
    each count of `SPENT` (bytes as bits), and the passes per client and round; a count the run lacks is
    `UNRECORDED`, a column no run holds left out and named below the table."""
    runs = [run for by_method in settings.values() for run in by_method.values()]
    held = [key for key in SPENT if any(run.get(key) is not None for run in runs)]

    def shown(run: dict, key: str) -> str:
        value = run.get(key)
        return UNRECORDED if value is None else count(8 * value if key.endswith("_bytes") else value, ".4g")

    per = [UNRECORDED if per_round(run) is None else f"{per_round(run):.3g}" for run in runs]
    lines = ["| setting | method | rounds | " + " | ".join(SPENT[k] for k in held) + " | local passes per client "
             "and round |", "|---|---|---|" + "---|" * len(held) + "---|"]
    lines += [f"| {TITLES[run['setting']]} | {label(run)} | {run['rounds']} | " +
              " | ".join(shown(run, key) for key in held) + f" | {p} |" for run, p in zip(runs, per)]
    missing = ", ".join(SPENT[key] for key in SPENT if key not in held)
    return [*lines, *(["", f"{missing[:1].upper()}{missing[1:]}: {UNRECORDED} (its runs predate these counts; the "
                       "benchmark records them now)."] if missing else [])]


def render(section: dict, source: str) -> str:
    settings = by_setting(section)
    methods = list(dict.fromkeys(run["method"] for runs in settings.values() for run in runs.values()))
    labels = {m: next(label(r[m]) for r in settings.values() if m in r) for m in methods}
    lines = [f"Generated by `dane figures fedprox_synthetic` from scripts/bench_fedprox_synthetic.py's JSON {source} "
             f"({section['started_at']}, load average {section['machine']['load_avg']}). "
             f"{commits_text(codes(section))} Softmax regression "
             f"(lam={section['lam']:g}, {intercept(section)}) on the seeded Synthetic sets (seed {section['seed']}), "
             f"{section['workers']} clients, {section['clients_per_round']} sampled a round, {section['rounds']} "
             f"rounds; {what_ran(section)}. Per cell: the last training objective (its rises, the sum of its "
             "round-to-round increases), and how a run that stopped early ended. The second table: what each run "
             "spent by its last round, summed over the sampled clients (HVPs, Hessians, factorizations: the "
             "Hessian-vector products, Hessians formed and factorizations, counted as the passes are by "
             "`dane.work`); the first ranks losses at equal rounds, not at equal cost.", "",
             "| setting | " + " | ".join(labels[m] for m in methods) + " |", "|---|" + "---|" * len(methods)]
    for setting, runs in settings.items():
        cells = [cell(runs[m]) if m in runs else "—" for m in methods]
        lines.append(f"| {TITLES[setting]} | " + " | ".join(cells) + " |")
    return "\n".join([*lines, "", *spent(settings), "", *claims(settings)])


def intercept(section: dict) -> str:
    """Whether the model had a bias per class: the section's ``fit_intercept`` (a section without the key ran
    without one: the bench passed none, and the problem's default is none)."""
    return "intercept" if section.get("fit_intercept") else "no intercept"


def title(section: dict) -> str:
    """The figure's title, from ``section``: the settings drawn, the model and λ, the clients (and those sampled a
    round), the rounds and the seed, then the local solve as it ran (`what_ran`: at most K steps, their step size,
    the passes per sampled client and round)."""
    sets = ", ".join(TITLES[s] for s in by_setting(section))
    return (f"FedProx's Synthetic(α, β) data, {sets}: softmax regression (λ = {section['lam']:g}, "
            f"{intercept(section)}), seed {section['seed']}\n{section['workers']} clients, "
            f"{section['clients_per_round']} sampled a round, {section['rounds']} rounds; {what_ran(section)}")


def draw(section: dict):
    import matplotlib.pyplot as plt

    from dane.paper_figs.common import wrapped

    settings = by_setting(section)
    width = max(4 * len(settings), 6.5)  # one panel (the long run) still has room for its title
    fig, axes = plt.subplots(1, len(settings), figsize=(width, 4.3), sharey=True, squeeze=False)
    fig.suptitle(wrapped(title(section), width), fontsize=10)
    for ax, (setting, runs) in zip(axes[0], settings.items()):
        for run in runs.values():
            ax.plot(range(len(run["objective"])), run["objective"], label=label(run))
        ax.set_title(TITLES[setting])
        ax.set_xlabel("round")
        ax.grid(True, alpha=0.3)
    top = 1.2 * max(run["objective"][0] for runs in settings.values() for run in runs.values())
    axes[0][0].set_ylim(0, top)  # a diverging run leaves the frame, not flattens the others
    axes[0][0].set_ylabel("training objective")
    axes[0][-1].legend(fontsize=8)
    return fig


def figure(sources: list[str | Path], out: str | Path, name: str = KEY) -> list[Path]:
    """The figure ``name`` from the one JSON in ``sources``, its table as ``name``.md and its sidecar; no page."""
    (source,) = sources
    return bench_figure(source, KEY, out, name, draw=draw, render=render, command="python -m scripts.bench fedprox_synthetic",
                        what=__doc__.splitlines()[0].replace("Figure and table: the", "The"), codes=codes)


def main(argv: list[str] | None = None) -> list[Path]:
    parser = bench_parser(__doc__, PAGE, figure=True)
    parser.add_argument("--block", choices=list(BLOCKS), default="table",
                        help="the page's block: table (the comparison) or long (the run at the paper's local updates)")
    args = parser.parse_args(argv)
    publish(render(bench_section(args.json, KEY), args.json), args.page, *BLOCKS[args.block], args.print)
    paths = figure([args.json], args.out, KEY if args.block == "table" else f"{KEY}_{args.block}")
    for path in paths:
        print(path)
    return paths


if __name__ == "__main__":
    main()
