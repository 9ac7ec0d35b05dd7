"""Test doubles for what cannot exist on this machine: an Ascend NPU and its software."""
