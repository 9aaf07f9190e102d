"""The standard post-hoc OOD scorers on the cached features, one small interface
(:class:`etn_cli.scorers.base.Scorer`): fit on ID statistics and the classifier, score rows.
Each registers itself as a head of family ``posthoc``; :mod:`etn_cli.scorers.catalogue` lists
them and the names OpenOOD and pytorch-ood use (aliases), which ``etn_cli.heads`` registers
once every head is there. Importing any scorer first imports ``etn_cli.heads``, so the
registry is always whole."""

import etn_cli.heads  # noqa: F401 - first: fills the registry, these scorers included
