"""What the subcommands share: the error that prints usage, and custom rules and
``--param`` overrides read from the arguments."""

from __future__ import annotations


class UsageError(Exception):
    pass


def rule_params(args):
    """Custom rules first (--rules module:Class), so --param can name them too."""
    # (imported when a command needs rules: `stepscope run` starts without pandas)
    from stepscope.analysis.rules import ParamError, RuleLoadError, load_spec, parse_params

    try:
        for spec in getattr(args, "rules", None) or []:
            load_spec(spec)
        return parse_params(args.param)
    except (ParamError, RuleLoadError) as exc:
        raise UsageError(str(exc)) from None
