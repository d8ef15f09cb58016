"""No-dependency helpers every layer may use: option checks, environment variables, the
launcher-worker protocol, text and system look-ups, logging. Imports the standard library and
:mod:`ddpkit.errors` only."""
