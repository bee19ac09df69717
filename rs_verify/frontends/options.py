"""Options that `rs-verify check` and the pytest plugin share, defined once.

Each entry is an option's name (the CLI's `--NAME`, the plugin's `--rs-NAME`) and the keyword
arguments that both argparse's `add_argument` and pytest's `addoption` take. Light to import
(the plugin loads it in every pytest session): only `engine.defaults`.
"""

from __future__ import annotations

from ..engine.defaults import (BASELINE_MODES, DEFAULT_MAX_SLOWDOWN, DEFAULT_TIMEOUT, DEFAULT_TIMING_TABLE,
                               ISOLATION_LEVELS)

SHARED = {
    "isolate": dict(choices=ISOLATION_LEVELS, default=ISOLATION_LEVELS[0],
                    help="where the sampler runs: 'property' (default) a child process per property, so that a "
                         "crash or a hang of the sampler fails that property with its batch and the run goes on; "
                         "'call' a fresh child per call; 'off' in this process (for debugging)"),
    "timeout": dict(type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                    help=f"a sampler call that does not return within this time fails its property (isolated "
                         f"samplers only; default {DEFAULT_TIMEOUT:g})"),
    "redis": dict(default=None, metavar="URL",
                  help="share Hypothesis failures through Redis (redis://host:port/db); default "
                       "$RS_VERIFY_REDIS_URL; the local directory database is still written"),
    "xfails": dict(default=None, metavar="FILE",
                   help="expected failures: one 'PROPERTY REASON... [match: REGEX]' per line ('#' comments); a "
                        "listed property that fails (its message matching REGEX) is an expected failure (xfail), "
                        "one that passes a strict failure (XPASS(strict)), one that fails differently an ordinary "
                        "failure; an unknown property or a malformed line is a usage error"),
    "deviations": dict(default=None, metavar="NAME,...",
                       help="declared deviations (SPEC section 11) added to the sampler's own, for a sampler one "
                            "cannot edit: shipped names (empty_residual_token0, inverse_cdf_last_token, "
                            "block_nan_prefix_resets) or module:attribute paths of Deviation records; the reference "
                            "applies their rules and the summary counts the decisions each decided"),
    "baseline": dict(default=None, metavar="SPEC",
                     help="gate the sampler against a baseline version: module:attribute, a built-in name, "
                          "git:<rev>[:module:attribute] (that revision of this repository, in a temporary git "
                          "worktree and a child process; default attribute: the sampler's spec), or "
                          "release:NAME==VERSION[:module:attribute] (that release, installed in the release cache, "
                          "the same adapter loaded from it in a child process). Adds matches_baseline (bit for bit; "
                          "a declared convention change is certified on both sides and counted) and "
                          "baseline_speed (CUDA)."),
    "baseline-catalogue": dict(default=None, metavar="FILE",
                               help="the releases.toml a release: baseline's pins and environment are read from "
                                    "(default: the packaged catalogue; format: rs_verify.engine.releases)"),
    "baseline-mode": dict(choices=BASELINE_MODES, default=BASELINE_MODES[0],
                          help="exact (default): bit for bit; certified: differences within the certification "
                               "tolerance against the reference, and then every distribution campaign must pass "
                               "too"),
    "max-slowdown": dict(type=float, default=DEFAULT_MAX_SLOWDOWN, metavar="RATIO",
                         help=f"fail when the change is slower than RATIO x the baseline (median; CUDA only; "
                              f"default {DEFAULT_MAX_SLOWDOWN})"),
    "timing-table": dict(default=DEFAULT_TIMING_TABLE, metavar="PATH",
                         help=f"where the speed comparison's Markdown table is written (default "
                              f"{DEFAULT_TIMING_TABLE})"),
}
ISOLATION = ("isolate", "timeout")
BASELINE = ("baseline", "baseline-mode", "max-slowdown", "timing-table", "baseline-catalogue")


def add(add_option, names, prefix: str = "", **overrides) -> None:
    """Add the shared options `names` through `add_option` (argparse's `add_argument` or pytest's
    `addoption`) as `--{prefix}{name}`; `overrides` maps an option's name (underscores for dashes)
    to keyword arguments that replace its defaults."""
    for name in names:
        add_option(f"--{prefix}{name}", **{**SHARED[name], **overrides.get(name.replace("-", "_"), {})})
