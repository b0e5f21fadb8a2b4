"""The log cleaner: compaction of ``cleanup.policy=compact`` logs with KIP-534 delete horizons.

Layers (each module's docstring has its contract and thread-safety)::

    config       CompactionConfig (topic keys the cleaner reads) and CleanerSettings (broker keys)
    batch_filter per batch, as bytes: which records a pass keeps; the KIP-534 horizon rewrite
    swap         the cleaned segment's files and the crash-safe swap (.cleaned -> .swap -> live)
    cleaner      one cleaning pass over one PartitionLog (plan, offset map, groups, swap)
    checkpoint   ``cleaner-offset-checkpoint`` of a data directory (first dirty offset per log)
    throttler    the bounded I/O rate (log.cleaner.io.max.bytes.per.second)
    scheduler    the background thread: which log to clean when, delete-horizon wake-ups

Files the cleaner adds to a partition directory (see swap.py for the order they appear in)::

    00000000000000000000.log.cleaned        a cleaned segment being written (discarded on open)
    00000000000000000000.index.cleaned      its offset index; .timeindex.cleaned its time index
    00000000000000000000.log.swap           a cleaned segment committed to replace old ones:
                                            finished on open (the old segments go, it goes live)
    00000000000000000000.cleaner-swap       "<base> <end>": the offset range the swap replaces

and one file to each data directory: ``cleaner-offset-checkpoint`` (Kafka's checkpoint format).

Only the cleaner imports the log, never the other way round (tests/unit/test_import_rules.py):
what every log open and append needs lives in the core, ``lowtide/log/swap_recovery.py`` (the
recovery of an interrupted swap, and these files' names) and ``lowtide/log/compacted_keys.py``
(the produce path's key check: no keyless record on a compacted topic). This ``__init__``
imports nothing, so importing one cleaner module loads only what it needs.
"""
