"""Targets whose SGLang model class captures the right hidden states but has no DFLASH entry point.

SGLang 0.5.23 asks the target for `set_dflash_layers_to_capture(ids)` (or the DSpark one) before serving
DFLASH (`configure_aux_hidden_state_capture`, model_runner_components/attention_backend_setup.py) and raises
"implements neither ..." otherwise. Qwen2ForCausalLM (Qwen2.5, Qwen2.5-Coder) lacks it, though its
`set_eagle3_layers_to_capture(ids)` with explicit ids does exactly what Qwen3's DFLASH method does: capture
before layer id + 1, i.e. the output of layer id, concatenated in order (models/qwen2.py, models/qwen3.py).
The hook below calls that method for such a target and leaves every other case to SGLang, so a model that
gains its own DFLASH method (or a later SGLang) is untouched. Registered on every device: the gap is SGLang's,
not the CPU's.
"""

from __future__ import annotations

HOOK_TARGET = ("sglang.srt.model_executor.model_runner_components.attention_backend_setup."
               "configure_aux_hidden_state_capture")
# the line of SGLang that refuses such a target (a test checks it is still there)
EVIDENCE = ("sglang.srt.model_executor.model_runner_components.attention_backend_setup",
            '"one of which is required for DFLASH/DSPARK."')


def lacks_dflash_capture(model) -> bool:
    return not hasattr(model, "set_dflash_layers_to_capture") and not hasattr(model, "set_dspark_layers_to_capture")


def around_aux_capture(original, *args, model, dflash_use_aux_hidden_state: bool, dflash_target_layer_ids,
                       **kwargs):
    """`configure_aux_hidden_state_capture` for a target without a DFLASH method: its EAGLE-3 method with
    the drafter's explicit layer ids (SGLang's own check otherwise)."""
    if (dflash_use_aux_hidden_state and dflash_target_layer_ids is not None and lacks_dflash_capture(model)
            and hasattr(model, "set_eagle3_layers_to_capture")):
        model.set_eagle3_layers_to_capture(list(dflash_target_layer_ids))
        dflash_use_aux_hidden_state = False  # done; SGLang still handles an EAGLE-3 request of its own
    return original(*args, model=model, dflash_use_aux_hidden_state=dflash_use_aux_hidden_state,
                    dflash_target_layer_ids=dflash_target_layer_ids, **kwargs)
