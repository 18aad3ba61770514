"""What verl 0.9.1 needs to run its FSDP engine on a machine without a GPU, through verl's own
extension points (tests only):

- a CPU platform: verl has none. With no accelerator its platform detection falls back to CUDA,
  and the engine's first ``get_device_id()`` (``data["loss_mask"].sum().to(get_device_id())`` in
  ``FSDPEngine.forward_backward_batch``) calls ``torch.cuda.current_device()``: RuntimeError
  "Found no NVIDIA driver". ``use_cpu_platform`` installs one with ``verl.plugin.platform.
  set_platform`` (device "cpu", module ``torch.cpu``, backend gloo). Call it before verl's engine
  modules are imported: ``verl.workers.engine.fsdp.transformer_impl`` reads the device name at
  import.
- trl >= 1.0 next to verl: verl's ``apply_monkey_patch`` (every FSDP engine's model build) imports
  ``AutoModelForCausalLMWithValueHead`` from ``trl.experimental.ppo`` or ``trl`` whenever trl is
  installed; trl 1.16 has neither, so the engine cannot be built (ImportError).
  ``skip_trl_value_head_patch`` tells verl trl is absent when that class is (verl only patches the
  class's ``state_dict`` there, for value-head models).
"""

import torch


def use_cpu_platform():
    """Makes verl's platform the CPU (verl.plugin.platform.set_platform)."""
    from verl.plugin.platform import set_platform
    from verl.plugin.platform.platform_cuda import PlatformCUDA

    class CPUPlatform(PlatformCUDA):
        @property
        def device_name(self):
            return "cpu"

        @property
        def device_module(self):
            return torch.cpu  # verl's memory logging recognises it and reports zeros

        def is_available(self):
            return True

        def current_device(self):
            return "cpu"

        def device_count(self):
            return 1

        def set_device(self, device_index):
            pass

        def synchronize(self, device_index=None):
            pass

        def empty_cache(self):
            pass

        def manual_seed(self, seed):
            torch.manual_seed(seed)

        def manual_seed_all(self, seed):
            torch.manual_seed(seed)

        def communication_backend_name(self):
            return "gloo"

    set_platform(CPUPlatform())


def skip_trl_value_head_patch(monkeypatch):
    """With a trl that has no AutoModelForCausalLMWithValueHead, verl's model patching is told trl
    is absent (``monkeypatch``: pytest's). Returns True when it had to."""
    import verl.models.transformers.monkey_patch as verl_patch

    try:
        from trl.experimental.ppo import AutoModelForCausalLMWithValueHead  # noqa: F401
    except ImportError:
        try:
            from trl import AutoModelForCausalLMWithValueHead  # noqa: F401
        except ImportError:
            monkeypatch.setattr(verl_patch, "is_trl_available", lambda: False)
            return True
    return False
