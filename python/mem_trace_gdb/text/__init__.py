"""The answers' text, as pure functions: no gdb, no process.

Each command reads what it needs from the tracer's tables into a small record
(`why.WhyFacts`, `history.HistoryFacts`, `info.InfoFacts`) and hands it to a
`lines()` function here, together with `parts.Lookups`: where stacks and thread
records are read, how a return address becomes frames, and which gdb thread a
kernel tid is. The commands pass gdb-backed lookups; the unit tests pass fakes.
"""
