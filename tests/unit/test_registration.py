"""A study's pre-registration: its statement checked with the study, and each hypothesis judged as stated."""

import math

import pandas as pd
import pytest
from scipy import stats
from workflow_runner import read_study

from trainer.analysis.registration import Preregistration, judge_hypotheses
from trainer.knobs import build_config
from trainer.study import StudyError, check_study

T_975_DF2 = 4.302652729911275  # scipy.stats.t.ppf(0.975, 2), as printed in any t table (4.303)


def _runs(values: dict[tuple[str, str], list[float]]) -> pd.DataFrame:
    rows = [
        {"model": m, "arm": a, "seed": s, "window_success": v, "heldout_auc": v / 2}
        for (m, a), vs in values.items()
        for s, v in enumerate(vs)
    ]
    return pd.DataFrame(rows)


def _registration(**over) -> Preregistration:
    statement = {
        "registered": "before the runs",
        "secondary": ["heldout_auc"],
        "hypotheses": [
            {"name": "H1", "claim": "a beats b", "arms": ["a", "b"], "bases": ["x1", "x2", "x3"]},
            {"name": "H2", "claim": "b beats a", "arms": ["b", "a"], "bases": ["x1", "x2", "x3"], "post_hoc": True},
        ],
        **over,
    }
    return build_config(Preregistration, statement, "preregistration")


def test_a_contrast_is_paired_within_each_base_with_its_seeds_averaged_first():
    # per-base means of a - b: x1 (0.6+0.4)/2 - 0.3, x2 0.52 - 0.3, x3 0.48 - 0.3 (in points: 20, 22, 18)
    runs = _runs(
        {
            ("x1", "a"): [0.6, 0.4],
            ("x1", "b"): [0.3],
            ("x2", "a"): [0.5, 0.54],
            ("x2", "b"): [0.3, 0.3],
            ("x3", "a"): [0.48, 0.48],
            ("x3", "b"): [0.3, 0.3],
        }
    )
    table = judge_hypotheses(runs, _registration())
    h1 = table[(table["hypothesis"] == "H1") & (table["role"] == "primary")].iloc[0]
    se = 2 / math.sqrt(3)  # sd of (20, 22, 18) is 2
    assert h1["estimate_pts"] == pytest.approx(20)
    assert (h1["ci_low_pts"], h1["ci_high_pts"]) == pytest.approx((20 - T_975_DF2 * se, 20 + T_975_DF2 * se))
    assert h1["df"] == 2 and h1["units"] == "3 bases"
    t = 20 / se
    assert h1["p"] == pytest.approx(1 - t / math.sqrt(2 + t * t))  # Student's t on 2 df in closed form
    # the post-hoc hypothesis is reported but outside the registered family: Holm adjusts H1 alone
    assert h1["p_adjusted"] == pytest.approx(h1["p"])
    assert h1["verdict"] == "supported"
    h2 = table[(table["hypothesis"] == "H2") & (table["role"] == "primary")].iloc[0]
    assert (h2["status"], h2["estimate_pts"], h2["verdict"]) == ("post hoc", pytest.approx(-20), "contradicted")
    secondary = table[table["role"] == "secondary"]
    assert list(secondary["outcome"]) == ["heldout_auc", "heldout_auc"]
    assert secondary.iloc[0]["estimate_pts"] == pytest.approx(10)
    assert secondary.iloc[0]["p_adjusted"] == pytest.approx(secondary.iloc[0]["p"])  # secondary: uncorrected


def test_holm_makes_two_registered_claims_share_alpha_and_a_null_states_what_it_could_detect():
    runs = _runs(
        {(m, arm): [v] for m, d in zip(("x1", "x2", "x3"), (0.2, 0.3, 0.1)) for arm, v in (("a", d), ("b", 0.0))}
    )
    reg = _registration(
        hypotheses=[
            {"name": "H1", "claim": "a beats b", "arms": ["a", "b"], "bases": ["x1", "x2", "x3"]},
            {"name": "H2", "claim": "b beats a", "arms": ["b", "a"], "bases": ["x1", "x2", "x3"]},
        ]
    )
    table = judge_hypotheses(runs, reg).query("role == 'primary'")
    t = 20 / (10 / math.sqrt(3))  # differences 20, 30, 10 points: sd 10
    p = 1 - t / math.sqrt(2 + t * t)  # 0.074
    assert list(table["p"]) == pytest.approx([p, p])
    assert list(table["p_adjusted"]) == pytest.approx([min(1, 2 * p)] * 2)
    assert list(table["verdict"]) == ["not shown", "not shown"]
    assert (table["mde_pts"] > 20).all()  # (t(0.975, 2) + t(0.8, 2)) x 5.77 = 32 points: a 20-point effect is missed


def test_an_interaction_compares_the_contrast_between_two_sets_of_bases():
    values = {}
    for m, d in (("x1", 0.2), ("x2", 0.3), ("x3", 0.1), ("y1", 0.0), ("y2", 0.1), ("y3", -0.1)):
        values[(m, "a")], values[(m, "b")] = [0.3 + d], [0.3]
    reg = _registration(
        hypotheses=[
            {
                "name": "H",
                "claim": "x gain more",
                "arms": ["a", "b"],
                "bases": ["x1", "x2", "x3"],
                "versus_bases": ["y1", "y2", "y3"],
            }
        ]
    )
    row = judge_hypotheses(_runs(values), reg).iloc[0]
    assert row["estimate_pts"] == pytest.approx(20)  # 20 - 0
    assert row["df"] == pytest.approx(4)  # equal variances and sizes: Welch's df is 2 + 2
    assert row["units"] == "3 vs 3 bases"


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda r: r["hypotheses"][0].update(arms=["a", "nope"]), r"preregistration.hypotheses\[0\].arms: \['nope'\]"),
        (lambda r: r["hypotheses"][0].update(bases=["nope"]), r"preregistration.hypotheses\[0\].bases: \['nope'\]"),
        (lambda r: r.update(outcome="collapsed"), "preregistration.outcome: 'collapsed' is not one of"),
        (lambda r: r["hypotheses"].append(dict(r["hypotheses"][0])), "preregistration.hypotheses: names repeat"),
    ],
)
def test_a_statement_naming_what_the_study_lacks_is_refused(change, message):
    study = {
        "study": "arms",
        "models": {"x1": {"preset": "qwen-tiny"}},
        "grid": [
            {"arm": "a", "recipes": ["spo_muon"], "seeds": [0]},
            {"arm": "b", "recipes": ["spo_adam"], "seeds": [0]},
        ],
        "preregistration": {
            "registered": "before",
            "hypotheses": [{"name": "H1", "claim": "c", "arms": ["a", "b"], "bases": ["x1"]}],
        },
    }
    change(study["preregistration"])
    with pytest.raises(StudyError, match=message):
        check_study(study)


def test_the_decisive_study_states_its_hypotheses_on_its_own_arms_and_bases():
    study = read_study("configs/base-optimizer.yaml")
    names = [h["name"] for h in study["preregistration"]["hypotheses"]]
    assert names[:4] == ["H1", "H2", "H3", "H4"]


def test_an_interaction_of_one_base_a_side_is_judged_over_seeds():
    """(a - b on x1) - (a - b on y1), each arm's seeds the units: the four means' variances add (hand-computed)."""
    values = {
        ("x1", "a"): [0.5, 0.6, 0.7],
        ("x1", "b"): [0.2, 0.3, 0.4],
        ("y1", "a"): [0.3, 0.4, 0.5],
        ("y1", "b"): [0.3, 0.35, 0.4],
    }
    reg = _registration(
        hypotheses=[{"name": "H", "claim": "x gains more", "arms": ["a", "b"], "bases": ["x1"], "versus_bases": ["y1"]}]
    )
    row = judge_hypotheses(_runs(values), reg).iloc[0]
    assert row["estimate_pts"] == pytest.approx((60 - 30) - (40 - 35))
    se = math.sqrt(3 * 100 / 3 + 25 / 3)  # three groups of sd 10 points and one of sd 5, three seeds each
    parts = [100 / 3] * 3 + [25 / 3]
    assert row["df"] == pytest.approx(sum(parts) ** 2 / sum(v * v / 2 for v in parts))  # Satterthwaite: 6.90
    assert row["ci_high_pts"] - row["estimate_pts"] == pytest.approx(se * stats.t.ppf(0.975, row["df"]))
    assert row["units"] == "seeds of one base a side (3 v 3 v 3 v 3)"
