"""Model zoo written with mixrt.gluon / mixrt.sym (training issue)."""
