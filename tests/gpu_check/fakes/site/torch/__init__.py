"""A fake torch for the rehearsal's env step: versions and one or FAKE_GPUS H200s;
hangs in cuda.is_available() when FAKE_HANG names env."""
import os
import time

__version__ = "2.11.0+fake"


class version:  # noqa: N801
    cuda = "13.0"


class backends:  # noqa: N801
    class cudnn:  # noqa: N801
        @staticmethod
        def version():
            return 91300


class cuda:  # noqa: N801
    @staticmethod
    def is_available():
        # FAKE_HANG=env: the env step hangs here, after printing the versions.
        if "env" in os.environ.get("FAKE_HANG", "").split():
            with open(os.path.join(os.environ["FAKE_STATE"], "pids", "env.pid"), "w") as f:
                f.write(f"{os.getpid()}\n")
            time.sleep(1000)
        return True

    @staticmethod
    def device_count():
        return int(os.environ.get("FAKE_GPUS", "1"))

    @staticmethod
    def get_device_name(index=0):
        return "NVIDIA H200"

    class nccl:  # noqa: N801
        @staticmethod
        def version():
            return (2, 28, 3)
