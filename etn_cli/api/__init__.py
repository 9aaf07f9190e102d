"""The Python API: heads on arrays (:mod:`.heads`), one module of backbone and head
(:mod:`.evidential_model`) and your own images (:mod:`.images`); ``import etn_cli`` names them."""
