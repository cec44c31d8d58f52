"""A family of models no one here designed, for the README's "Your own models": three scikit-learn classifiers of
different cost trained on the digits scikit-learn ships, converted to ONNX by skl2onnx (installed with the test
extras), and the held-out rows with their labels for `accscale profile triton --data`.

    python examples/sklearn_family.py      # writes logreg.onnx, mlp.onnx, svc.onnx and digits-test.npz here
"""

import warnings

import numpy as np
from skl2onnx import to_onnx
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier
from sklearn.svm import SVC

# skl2onnx reads SVC's probA_/probB_, which scikit-learn 1.9 marks deprecated: not ours to act on
warnings.filterwarnings("ignore", category=FutureWarning, module="sklearn")
digits = load_digits()
x_train, x_test, y_train, y_test = train_test_split(digits.data.astype(np.float32) / 16, digits.target,
                                                    test_size=0.3, random_state=0, stratify=digits.target)
family = {"logreg": LogisticRegression(max_iter=300),
          "mlp": MLPClassifier(hidden_layer_sizes=(256, 256), max_iter=1000, random_state=0),
          "svc": SVC(C=10, gamma=0.02)}  # the most accurate and, its cost growing with the batch, the slowest
for name, estimator in family.items():
    estimator.fit(x_train, y_train)
    # zipmap off: the probabilities as one FP32 tensor, which Triton serves, not a list of maps
    model = to_onnx(estimator, x_train[:1], options={id(estimator): {"zipmap": False}}, target_opset=17)
    with open(f"{name}.onnx", "wb") as f:
        f.write(model.SerializeToString())
    print(f"{name}.onnx: held-out accuracy {(estimator.predict(x_test) == y_test).mean():.4f} (scikit-learn's own)")
np.savez("digits-test.npz", X=x_test, labels=y_test)
print("digits-test.npz: the held-out rows (X) and their labels")
