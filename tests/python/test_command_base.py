"""The argparse command base (commands/base.py) over a stand-in `gdb` module.

What the base promises, checked without a process: the rest of the line after
the options is one expression, spaces and all; `-h` prints and returns; every
failure is one `gdb.GdbError` line naming the command. test_gdb.py checks the
same commands under real gdb.

Run from the repository root: python3 -m unittest discover -s tests/python -v
"""

import argparse
import importlib
import os
import sys
import types
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))


def fake_gdb():
    """The few names the command modules use at import and in the base."""
    gdb = types.ModuleType("gdb")

    class GdbError(Exception):
        pass

    class error(RuntimeError):  # noqa: N801 - gdb's own name
        pass

    class Command:
        def __init__(self, name, command_class, completer=None):
            self.registered = (name, command_class, completer)

        def dont_repeat(self):
            pass

    gdb.GdbError, gdb.error, gdb.MemoryError, gdb.Command = GdbError, error, error, Command
    gdb.output = []
    gdb.write = lambda text, stream=None: gdb.output.append(text)
    gdb.parameter = lambda name: "message"
    for i, name in enumerate(
        "COMMAND_DATA COMMAND_STATUS COMPLETE_NONE COMPLETE_EXPRESSION TYPE_CODE_STRUCT "
        "TYPE_CODE_UNION TYPE_CODE_FLT TYPE_CODE_VOID TYPE_CODE_DECFLOAT TYPE_CODE_COMPLEX "
        "TYPE_CODE_STRING TYPE_CODE_SET TYPE_CODE_INT TYPE_CODE_CHAR TYPE_CODE_BOOL "
        "TYPE_CODE_ENUM TYPE_CODE_RANGE TYPE_CODE_REF TYPE_CODE_RVALUE_REF TYPE_CODE_PTR "
        "TYPE_CODE_ARRAY TYPE_CODE_FUNC".split()
    ):
        setattr(gdb, name, i)
    return gdb


class BaseTests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.saved = {n: m for n, m in sys.modules.items() if n == "gdb" or n.startswith("mem_trace_gdb")}
        for name in cls.saved:
            del sys.modules[name]
        sys.modules["gdb"] = cls.gdb = fake_gdb()
        cls.base = importlib.import_module("mem_trace_gdb.commands.base")
        cls.errors = importlib.import_module("mem_trace_gdb.commands.errors")
        cls.history = importlib.import_module("mem_trace_gdb.commands.history")
        cls.info = importlib.import_module("mem_trace_gdb.commands.info")

    @classmethod
    def tearDownClass(cls):
        # Leave no stand-in behind: other tests check that plain Python never sees gdb.
        for name in [n for n in sys.modules if n == "gdb" or n.startswith("mem_trace_gdb")]:
            del sys.modules[name]
        sys.modules.update(cls.saved)

    def setUp(self):
        self.gdb.output.clear()

    def command(self, run, *arguments):
        """An ArgparsedCommand `probe` with ``arguments`` and ``run`` as its answer."""
        probe_parser = self.base.ArgumentParser(prog="probe", description="Probe the base.")
        for flags, kwargs in arguments:
            probe_parser.add_argument(*flags, **kwargs)

        class Probe(self.base.ArgparsedCommand):
            parser = probe_parser

            def run(self, args):
                return run(args)

        return Probe()

    def expression_command(self, seen):
        self.base.address_of = lambda text: seen.append(text) or 0x1234
        return self.command(
            lambda args: seen.append(args) or ["answer"],
            (("-n",), dict(type=int, default=None)),
            (("--gap",), dict(type=int, default=4096)),
            (("-r",), dict(action="store_true")),
            (("address",), dict(type=self.base.Expression, metavar="EXPR")),
        )

    def test_the_rest_of_the_line_is_one_expression(self):
        parse = self.base.parse
        parser = self.history.parser
        cases = {
            "p": ("p", 8),
            "  s->name + 5  ": ("s->name + 5", 8),
            "-n 3 &v[3]": ("&v[3]", 3),
            "-n=2 (char *) p + 1": ("(char *) p + 1", 2),
            "--frames 0 -- -1": ("-1", 0),
            "-1": ("-1", 8),
            "-x + 3": ("-x + 3", 8),
            "'a.c'::v": ("'a.c'::v", 8),
            '"a b"': ('"a b"', 8),
        }
        for line, (expression, frames) in cases.items():
            args = parse(parser, line)
            self.assertEqual((args.address, args.frames), (expression, frames), line)
            self.assertIsInstance(args.address, self.base.Expression)

    def test_shared_options_are_spelled_alike(self):
        """Frames per stack is -f/--frames and a count of entries -n/--count in every
        command that has one, as in `mem-trace`; the spellings they replaced still parse."""
        parsers = {}
        for name in ("why", "history", "top", "peaks", "leaks", "info"):
            parsers[name] = importlib.import_module(f"mem_trace_gdb.commands.{name}").parser
            for action in parsers[name]._actions:
                if action.help == argparse.SUPPRESS:
                    continue
                if "frames" in (action.help or ""):
                    self.assertEqual(action.option_strings, ["-f", "--frames"], name)
                if action.dest == "count" or "-n" in action.option_strings:
                    self.assertEqual(action.option_strings, ["-n", "--count"], name)
            usage = parsers[name].format_usage()
            self.assertNotIn("--max-frames", usage, name)
        parse = self.base.parse
        for line in ("-f 3 p", "-n 3 p", "--max-frames 3 p", "--max-frames=3 p"):
            self.assertEqual(parse(parsers["why"], line).frames, 3, line)
        self.assertEqual(parse(parsers["why"], "p").frames, 0)
        self.assertEqual(parse(parsers["history"], "-n 3 p").frames, 3)
        top = parsers["top"]
        self.assertEqual(top.parse_args(["-n", "3"]).count, 3)
        self.assertEqual(top.parse_args(["3", "--by", "blocks"]).count_word, 3)

    def test_expressions_are_evaluated_after_the_line_parsed(self):
        seen = []
        command = self.expression_command(seen)
        command.invoke("-n 2 -r buf + 16", False)
        self.assertEqual(seen[0], "buf + 16")
        self.assertEqual((seen[1].address, seen[1].n, seen[1].r), (0x1234, 2, True))
        self.assertEqual(self.gdb.output, ["answer\n"])
        seen.clear()
        with self.assertRaises(self.gdb.GdbError) as e:
            command.invoke("--bogus p", False)
        self.assertEqual(str(e.exception), "probe: unrecognized arguments: --bogus (see 'probe -h')")
        self.assertEqual(seen, [], "nothing is evaluated for a bad command line")

    def test_help_prints_and_returns(self):
        command = self.expression_command([])
        command.invoke("-h", False)
        text = "".join(self.gdb.output)
        self.assertTrue(text.startswith("usage: probe [-h] [-n N] [--gap GAP] [-r] EXPR\n"), text)
        self.assertIn("Probe the base.", text)
        command.invoke("--help", False)
        self.assertEqual(self.gdb.output[-1], text)

    def test_help_text_puts_the_description_first(self):
        doc = self.history.HistoryCommand.__doc__
        self.assertTrue(doc.startswith(
            "List every remembered allocation and free of the memory at an address, newest first.\n"
            "\nusage: mtrace-history [-h] [-f N] [--no-stacks] [-r] EXPR\n"), doc)
        self.assertEqual(doc.count("List every remembered"), 1)

    def test_completion_follows_the_parser(self):
        self.assertEqual(self.history.HistoryCommand().registered,
                         ("mtrace-history", self.gdb.COMMAND_DATA, self.gdb.COMPLETE_EXPRESSION))
        self.assertEqual(self.info.InfoCommand().registered,
                         ("mtrace-info", self.gdb.COMMAND_STATUS, self.gdb.COMPLETE_NONE))

    def assertOneLine(self, invoke, message):
        with self.assertRaises(self.gdb.GdbError) as e:
            invoke()
        self.assertEqual(str(e.exception), message)
        self.assertIsNone(e.exception.__cause__)
        self.assertTrue(e.exception.__suppress_context__)

    def test_errors_are_one_line(self):
        history = self.history.HistoryCommand()
        self.assertOneLine(lambda: history.invoke("", False),
                           "mtrace-history: the following arguments are required: EXPR "
                           "(see 'mtrace-history -h')")
        self.assertOneLine(lambda: history.invoke("-n -1 p", False),
                           "mtrace-history: -n -1: the number of frames cannot be negative "
                           "(see 'mtrace-history -h')")
        self.assertOneLine(lambda: history.invoke("-f x p", False),
                           "mtrace-history: argument -f/--frames: invalid int value: 'x' "
                           "(see 'mtrace-history -h')")
        self.assertOneLine(lambda: self.info.InfoCommand().invoke("extra", False),
                           "mtrace-info: unrecognized arguments: extra (see 'mtrace-info -h')")
        errors = importlib.import_module("mem_trace_gdb.errors")
        for error, message in [
            (errors.MemTraceError("stack 3: 9999 frames\nsecond line"),
             "probe: stack 3: 9999 frames"),
            (self.gdb.error('No symbol "p" in current context.'),
             'probe: No symbol "p" in current context.'),
            (self.errors.UsageError("`x` is a struct, not an address"),
             "probe: `x` is a struct, not an address"),
            (self.gdb.GdbError("probe: already named"), "probe: already named"),
            (KeyError("k"),
             "probe: internal error: KeyError: 'k' (`set python print-stack full` shows the "
             "traceback; please report it)"),
        ]:
            def fail(args, error=error):
                raise error
            command = self.command(fail)
            self.assertOneLine(lambda: command.invoke("", False), message)

    def test_internal_errors_keep_their_traceback_when_asked(self):
        self.gdb.parameter = lambda name: "full"
        try:
            def fail(args):
                raise KeyError("k")
            with self.assertRaises(KeyError):
                self.command(fail).invoke("", False)
        finally:
            self.gdb.parameter = lambda name: "message"

    def test_a_parser_without_positionals_takes_no_expression(self):
        parser = self.base.ArgumentParser(prog="probe")
        self.assertFalse(self.base.takes_expression(parser))
        with self.assertRaises(self.errors.UsageError):
            self.base.parse(parser, "-- p")
        self.assertIsInstance(self.base.parse(parser, ""), argparse.Namespace)


if __name__ == "__main__":
    unittest.main()
