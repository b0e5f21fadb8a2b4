"""The `lowtide` entry point: which modules a command line imports."""

from __future__ import annotations

import importlib
import subprocess
import sys

from lowtide.cli import main as cli_main


def test_the_command_table_names_exactly_what_each_module_registers():
    registered = {}
    for name in cli_main.COMMAND_MODULES:
        parser = cli_main.CliArgumentParser(prog="lowtide")
        subparsers = parser.add_subparsers(dest="command")
        importlib.import_module(name).register(subparsers)
        registered.update({command: name for command in subparsers.choices})
    assert cli_main.COMMANDS == registered


def test_a_client_command_does_not_import_the_servers_or_the_cluster_supervisor():
    code = ("import sys\n"
            "from lowtide.cli.main import main\n"
            "main(['topics', 'list', '--bootstrap-server', '127.0.0.1:1', '--output', 'json'])\n"
            "heavy = [m for m in ('lowtide.kafka.broker', 'lowtide.localcluster.cluster', 'lowtide.replica.manager')"
            " if m in sys.modules]\n"
            "print('HEAVY', heavy)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "HEAVY []" in out.stdout, out.stdout + out.stderr


def test_a_cluster_error_keeps_its_code_name():
    out = subprocess.run([sys.executable, "-m", "lowtide.cli.main", "cluster", "status", "--data-dir",
                          "/nonexistent/lowtide-cluster", "--output", "json"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode != 0
    assert '"code":"CLUSTER_NOT_FOUND"' in out.stdout.replace(" ", ""), out.stdout + out.stderr
