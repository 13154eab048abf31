"""The driver behind ``ct.run``: the loop (``run``), where it stands (``progress``), its options, each checked
when built (``options``), metrics and logs (``monitor``), evaluation, checkpoints, pre-emption and the naming of
what a rank waited for (``waiting``). The transforms know nothing of it; it knows the transforms only through
``TrainStep``'s capability flags and ``setup`` hook."""
