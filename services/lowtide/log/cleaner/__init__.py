"""The log cleaner: compaction of ``cleanup.policy=compact`` logs with KIP-534 delete horizons.

Layers (each module's docstring has its contract and thread-safety)::

    config       CompactionConfig (topic keys the cleaner reads) and CleanerSettings (broker keys)
    batch_filter per batch, as bytes: which records a pass keeps; the KIP-534 horizon rewrite;
                 the key check of the produce path (no keyless records on a compacted topic)
    swap         the cleaned segment's files, the crash-safe swap (.cleaned -> .swap -> live) and
                 the recovery of an interrupted swap when a partition directory is opened
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

This ``__init__`` imports nothing on purpose: ``segment_set`` and ``partition_log`` import
``swap`` and ``batch_filter`` for their hooks, while ``cleaner`` and ``scheduler`` import
``partition_log``; an eager import here would make that a cycle.
"""
