"""Keyword arguments as the command line's flags: the one conversion every function uses, so
that a Python call and a shell command are checked by the same parser."""

import numbers


def flag_args(**kwargs):
    """`--name value` for each keyword (underscores become dashes).

    True gives the bare flag and False or None leaves it out; a list or tuple is one
    comma-separated value (--dp 1,4,16, --stage-layers 3,4).
    """
    args = []
    for key, value in kwargs.items():
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif isinstance(value, (list, tuple)):
            args += [flag, ",".join(_text(v) for v in value)]
        else:
            args += [flag, _text(value)]
    return args


def _text(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):
        return repr(float(value))  # every digit: 2e-3 stays 2e-3
    return str(value)
