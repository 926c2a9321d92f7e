"""finetune: fine-tune pre-trained text encoders with modern objectives, and measure what they do."""

__version__ = "0.1.0"
