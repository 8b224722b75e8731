"""Reading an Ember config's sections in the bench/ scripts that mirror it in PyTorch
(bench/charlm_torch.py, bench/epoch_torch.py): every key a script does not mirror is refused,
by name, instead of being ignored."""


class ConfigError(Exception):
    pass


REQUIRED = object()  # a default that says the key must be given


def take(opts, where, allowed):
    """opts (a map, or None) as a dict, refusing keys outside allowed ({key: default})."""
    if opts is not None and not isinstance(opts, dict):
        raise ConfigError(f"{where}: expected a map")
    opts = dict(opts or {})
    extra = sorted(set(opts) - set(allowed))
    if extra:
        raise ConfigError(f"{where}: {', '.join(extra)}: not mirrored by this script "
                          f"(it mirrors {', '.join(sorted(allowed)) or 'no options'})")
    missing = [k for k, v in allowed.items() if v is REQUIRED and k not in opts]
    if missing:
        raise ConfigError(f"{where}: {', '.join(missing)} missing")
    return {k: opts.get(k, v) for k, v in allowed.items()}
