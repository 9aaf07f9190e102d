"""The standard post-hoc OOD scorers on the cached features, one small interface
(:class:`etn_cli.heads.scorers.base.Scorer`): fit on ID statistics and the classifier, score
rows. Each registers itself as a head of family ``posthoc``;
:mod:`etn_cli.heads.scorers.catalogue` lists them and the names OpenOOD and pytorch-ood use
(aliases), which ``etn_cli.heads`` registers once every head is there. Importing any scorer
first runs ``etn_cli/heads/__init__.py``, so the registry is always whole."""
