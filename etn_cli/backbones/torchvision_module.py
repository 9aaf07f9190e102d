"""The torchvision backbone's own forward pass as a torch module, for
``EvidentialModel.from_backbone``: TorchScript or eager, its feature hooks and its autocast,
so a wrapped model computes exactly what ``etn extract`` stores."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from etn_cli.backbones.image_inputs import collate_images


class BackboneFeatures(nn.Module):
    """An etn image backbone's own forward pass (``Backbone.run``): the hidden state, logits
    and pooled layers exactly as ``etn extract`` stores them, for a preprocessed batch or a
    list of images (the backbone's preprocessing)."""

    def __init__(self, backbone: Any) -> None:
        super().__init__()
        self.backbone = backbone
        self.model = backbone.model  # registered, so .to(...) and state_dict() see it
        self.hidden_size, self.num_classes = backbone.hidden_size, backbone.num_classes
        self.layer_names = tuple(backbone.config.layers)
        self.describe = f"the {backbone.name} backbone (layer {backbone.head_name!r})"

    def forward(self, inputs: Any) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        if isinstance(inputs, torch.Tensor):
            x = inputs
        else:
            images = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
            pairs = [(self.backbone.transform(im), 0, i) for i, im in enumerate(images)]
            x, _, _ = collate_images(pairs)
        device = next(iter(self.model.parameters())).device
        hidden, logits, layers = self.backbone.run(x.to(device), with_layers=True)
        return hidden.cpu(), logits.cpu(), {k: v.float().cpu() for k, v in layers.items()}
