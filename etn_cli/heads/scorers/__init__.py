"""The standard post-hoc OOD scorers on the cached features, one small interface
(:class:`etn_cli.heads.scorers.base.Scorer`): fit on ID statistics and the classifier, score
rows. Each registers itself as a head of family ``posthoc``; its record in
:mod:`etn_cli.catalogue` names its module, its score and the names OpenOOD and pytorch-ood
use (aliases). Their settings are in :mod:`etn_cli.heads.scorers.settings`."""
