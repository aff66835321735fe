"""What runs on a GPU node: the user-data renderer (`userdata.py`) and its shell scripts (`*.sh`)."""
