"""The data the estimator suites score on: a scikit-learn data set, split and standardized."""

from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler


def standardized_split(load, classifier: bool):
    """``(X_train, X_test, y_train, y_test)`` of ``load``: a quarter held out (stratified for
    a classifier), both parts scaled by the training part's statistics."""
    X, y = load(return_X_y=True)
    X_tr, X_te, y_tr, y_te = train_test_split(
        X, y, test_size=0.25, random_state=0, stratify=y if classifier else None)
    scaler = StandardScaler().fit(X_tr)
    return scaler.transform(X_tr), scaler.transform(X_te), y_tr, y_te
