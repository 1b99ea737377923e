"""placeholder"""
def install_reference_forward(model):
    raise NotImplementedError("reference forward not written yet")
