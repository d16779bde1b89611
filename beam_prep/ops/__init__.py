"""The built-in ops; importing this package registers them (see `registry`)."""

from beam_prep.ops import clicks, crop, disks, distance, flip, image, previous  # noqa: F401  pylint: disable=unused-import
