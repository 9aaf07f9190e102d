"""Artefacts besides feature splits: the backbone's final layer (:mod:`.classifier`) and the
files of a trained head (:mod:`.headfiles`)."""
