"""graft: dynamic weight grafting for transformer language models.

Run a pretrained base model while chosen components, at chosen token positions and
layers, compute with a finetuned donor's weights -- in one batched forward pass.
"""

__version__ = "0.1.0"
