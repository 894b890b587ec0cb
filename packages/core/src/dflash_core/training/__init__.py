"""The DFlash training recipe: target-aligned data, block-diffusion drafter training, resume."""
