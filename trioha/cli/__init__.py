"""The ``trioha`` command (``python -m trioha``): RocketMQ's ``mqbroker``, ``mqnamesrv`` and a
few ``mqadmin`` tools, on trioha's own rooms.

One module per group of commands, each adding its own with ``register_commands``:
``_brokers`` (``master``, ``slave``; ``--truncate-to-master`` in ``_reseed``), ``_demo``,
``_tools`` (``namesrv``, ``put``, ``tail``, ``status``), and the pipeline's ``audit``,
``export`` and ``stats`` from :mod:`trioha.pipeline`; ``_shared`` holds the argument types and
options they share, ``_main`` the parser, the help and the one-line error report.
"""

from trioha.cli._main import COMMAND_HELP, EXIT_CODES, build_parser, error_line, main

__all__ = ["COMMAND_HELP", "EXIT_CODES", "build_parser", "error_line", "main"]
