"""examples/images.toml in Python; run it where model.safetensors and my_images/ are."""

import numpy as np
import torchvision
from safetensors.torch import load_file
from sklearn.metrics import roc_auc_score

import etn_cli

model = torchvision.models.resnet18(num_classes=3)
model.load_state_dict(load_file("model.safetensors"))
transform = torchvision.models.ResNet18_Weights.IMAGENET1K_V1.transforms()
classes = "my_images/classes.txt"  # class names in the order of the model's outputs

adapt = etn_cli.ImageFolder("my_images/adapt", classes=classes)  # (PIL image, label) pairs
hidden, logits, labels = etn_cli.image_features(model, adapt, transform)
head = etn_cli.ETN(seed=0).fit(hidden, logits, labels)

wrapped = etn_cli.EvidentialModel.from_torchvision(model, head, transform)
test = wrapped([image for image, _ in etn_cli.ImageFolder("my_images/test", classes=classes)])
ood = wrapped([image for image, _ in etn_cli.ImageFolder("my_images/ood")])  # unlabelled
is_id = np.r_[np.ones(len(test.mp)), np.zeros(len(ood.mp))]
print(f"test predictions: {[adapt.classes[k] for k in test.predictions[:5]]} ...")
print(f"OOD AUROC by uncertainty mass: {roc_auc_score(is_id, np.r_[test.um, ood.um]):.3f}")
