"""
Sparse, text-like data with a linear model
==========================================

Text classification works on wide, sparse matrices: thousands of words, of which a document
uses a few dozen. This example makes a corpus of three topics out of invented words (no
download), turns it into a TF-IDF matrix in SciPy's CSR format with scikit-learn's
:class:`~sklearn.feature_extraction.text.TfidfVectorizer`, and trains
:class:`~ortlearn.estimators.OrtLogisticRegression` and
:class:`~ortlearn.estimators.OrtLinearSVC` on it next to their scikit-learn counterparts,
without ever making the matrix dense.
"""

# %%
# A corpus without a download
# ---------------------------
#
# The vocabulary is 5000 invented words made of syllables. Most words of a document come from a
# background distribution shared by all topics, with Zipf's law for the word frequencies (the
# word of rank ``r`` has a probability proportional to ``1 / r``), as in real text. Each of the
# three topics owns 300 words of the vocabulary, and about 7 % of a document's words (a
# binomial draw) come from its topic's words, again with Zipf's law. Documents have 20 to 100
# words. The topics are therefore hard to tell apart from a handful of words, and a linear
# model has to find the few hundred informative words among thousands of others.

import time
import tracemalloc

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import ScalarFormatter
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn.svm import LinearSVC
from threadpoolctl import threadpool_limits

from ortlearn import OrtLinearSVC, OrtLogisticRegression

rng = np.random.default_rng(0)
n_words, n_topic_words, n_docs, topic_share = 5000, 300, 3000, 0.07
topics = np.array(["sport", "science", "cooking"])

consonants, vowels = list("bcdfghjklmnprstvz"), list("aeiou")
vocabulary = set()
while len(vocabulary) < n_words:
    syllables = [rng.choice(consonants) + rng.choice(vowels) for _ in range(rng.integers(1, 4))]
    vocabulary.add("".join(syllables) + rng.choice(["", "n", "s", "r"]))
vocabulary = rng.permutation(sorted(vocabulary))


def zipf(n):
    """Zipf's law on ``n`` ranks: probabilities proportional to 1 / rank."""
    weights = 1.0 / np.arange(1, n + 1)
    return weights / weights.sum()


background = zipf(n_words)[rng.permutation(n_words)]
topic_words = rng.permutation(n_words)[: len(topics) * n_topic_words].reshape(len(topics), -1)

documents, labels = [], []
for _ in range(n_docs):
    topic = rng.integers(len(topics))
    length = rng.integers(20, 101)
    from_topic = rng.binomial(length, topic_share)
    words = np.concatenate([
        rng.choice(topic_words[topic], from_topic, p=zipf(n_topic_words)),
        rng.choice(n_words, length - from_topic, p=background),
    ])
    documents.append(" ".join(vocabulary[rng.permutation(words)]))
    labels.append(topics[topic])
labels = np.array(labels)

print("a 'sport' document:", documents[np.flatnonzero(labels == "sport")[0]][:150], "...")

# %%
# TF-IDF, in CSR format
# ---------------------
#
# The vectorizer learns its vocabulary on the training documents. Its output is a
# ``scipy.sparse`` CSR matrix: about 1 % of its entries are non-zero.

docs_train, docs_test, y_train, y_test = train_test_split(
    documents, labels, test_size=0.25, stratify=labels, random_state=0
)
vectorizer = TfidfVectorizer()
X_train = vectorizer.fit_transform(docs_train)
X_test = vectorizer.transform(docs_test)
words = vectorizer.get_feature_names_out()

dense_mb = X_train.shape[0] * X_train.shape[1] * X_train.dtype.itemsize / 1e6
csr_mb = (X_train.data.nbytes + X_train.indices.nbytes + X_train.indptr.nbytes) / 1e6
print(f"X_train: {type(X_train).__name__}, {X_train.shape[0]} x {X_train.shape[1]}, "
      f"{X_train.nnz} non-zeros ({X_train.nnz / np.prod(X_train.shape):.2%})")
print(f"memory: {csr_mb:.1f} MB as CSR, {dense_mb:.1f} MB if it were dense")

# %%
# Four fits on the sparse matrix
# ------------------------------
#
# ``OrtLogisticRegression`` and ``OrtLinearSVC`` are full-batch models: they minimise the
# objective of ``LogisticRegression`` and ``LinearSVC`` with L-BFGS, onnxruntime computing the
# loss and its gradient. With a sparse ``X`` they never densify it: SciPy computes the
# products ``X @ coef`` and ``X.T @ d``, onnxruntime the rest, so an evaluation costs time and
# memory in the non-zeros only. ``OrtLinearSVC`` takes sparse input with the squared hinge
# loss (its default, solved in the primal); ``loss='hinge'`` is solved in the dual, which
# refuses sparse input with a ``ValueError`` naming the loss to use instead.
#
# The mini-batch estimators (``OrtSGDClassifier``, ``OrtLinearClassifier``, the MLPs) take
# sparse input too, but densify it one block of mini-batches at a time (at most 64 MB), as
# their training graphs read dense rows.
#
# The fits run with the default parameters and all converge without a warning. Times are of
# one fit each, on one thread for both libraries (``threadpool_limits``, which ortlearn also
# reads), after a first fit of each model that pays the one-time costs (imports, the first
# onnxruntime session); they were measured on the shared two-core machine that built this
# documentation.

models = {
    "LogisticRegression": (LogisticRegression(), OrtLogisticRegression()),
    "LinearSVC": (LinearSVC(), OrtLinearSVC()),
}

results = {}
with threadpool_limits(limits=1):
    for family, (sk_model, ort_model) in models.items():
        for library, model in [("scikit-learn", sk_model), ("ortlearn", ort_model)]:
            model.fit(X_train[:100], y_train[:100])  # warm-up
            start = time.perf_counter()
            model.fit(X_train, y_train)
            seconds = time.perf_counter() - start
            results[family, library] = (model.score(X_test, y_test), seconds)
            n_iter = np.max(model.n_iter_)
            print(f"{type(model).__name__:>21}: test accuracy {results[family, library][0]:.4f}, "
                  f"fit {seconds:.3f} s, {n_iter} iterations")

# %%
# ``n_iter_`` counts L-BFGS iterations for both logistic regressions, which take the same
# path. For ``LinearSVC`` it counts the iterations of liblinear's own solver (here, with more
# words than documents, ``dual='auto'`` picks coordinate descent on the dual), against the
# L-BFGS iterations of ``OrtLinearSVC``: L-BFGS needs several hundred on the squared hinge,
# whose gradient has kinks, and ``OrtLinearSVC`` is the slower of the pair here. The models
# themselves agree:

for family, (sk_model, ort_model) in models.items():
    same = np.mean(sk_model.predict(X_test) == ort_model.predict(X_test))
    gap = np.abs(sk_model.coef_ - ort_model.coef_).max() / np.abs(sk_model.coef_).max()
    print(f"{family}: {same:.1%} of the test predictions agree, "
          f"largest coefficient gap {gap:.1e} of the largest coefficient")

# %%
# The sparse path, measured
# -------------------------
#
# ``tracemalloc`` records the memory that NumPy and SciPy allocate during one more fit of
# ``OrtLogisticRegression``. Had the matrix been densified, its dense copy alone would show in
# the peak.

tracemalloc.start()
OrtLogisticRegression().fit(X_train, y_train)
_, peak = tracemalloc.get_traced_memory()
tracemalloc.stop()
print(f"peak memory allocated during the fit: {peak / 1e6:.1f} MB "
      f"(the dense matrix would be {dense_mb:.1f} MB)")

# %%
# Accuracy and fit time
# ---------------------

fig, (ax_acc, ax_time) = plt.subplots(1, 2, figsize=(9, 4))
x = np.arange(len(models))
for shift, library in [(-0.2, "scikit-learn"), (0.2, "ortlearn")]:
    accuracy = [results[family, library][0] for family in models]
    seconds = [results[family, library][1] for family in models]
    ax_acc.bar_label(ax_acc.bar(x + shift, accuracy, width=0.4, label=library), fmt="%.3f")
    ax_time.bar_label(ax_time.bar(x + shift, [1e3 * t for t in seconds], width=0.4,
                                  label=library), fmt="%.0f ms")
for ax in (ax_acc, ax_time):
    ax.set_xticks(x, list(models))
    ax.set_xlabel("model")
    ax.legend()
lowest = min(result[0] for result in results.values())
ax_acc.set_ylim(lowest - 0.05, 1.0)
ax_acc.set_ylabel("test accuracy")
ax_acc.set_title("Test accuracy")
all_ms = [1e3 * result[1] for result in results.values()]
ax_time.set_yscale("log")
ax_time.set_ylim(min(all_ms) / 3, max(all_ms) * 3)
ax_time.yaxis.set_major_formatter(ScalarFormatter())
ax_time.minorticks_off()
ax_time.set_ylabel("fit time (ms, log scale)")
ax_time.set_title("Fit time, one thread")
fig.suptitle(f"TF-IDF, {X_train.shape[0]} documents x {X_train.shape[1]} words, sparse")
fig.tight_layout()
plt.show()

# %%
# The words that decide
# ---------------------
#
# ``coef_`` has one row per topic (multinomial logistic regression). The words with the
# largest coefficients of each topic should be words of that topic; the corpus was built so we
# can check: each title counts how many of the ten are the topic's own words.

ort_lr = models["LogisticRegression"][1]
fig, axes = plt.subplots(1, len(topics), figsize=(10, 4))
for row, ax in enumerate(axes):
    topic = ort_lr.classes_[row]
    own = set(vocabulary[topic_words[list(topics).index(topic)]])
    top = np.argsort(ort_lr.coef_[row])[::-1][:10]
    is_own = [words[i] in own for i in top]
    ax.barh(np.arange(10)[::-1], ort_lr.coef_[row, top])
    ax.set_yticks(np.arange(10)[::-1], words[top])
    ax.set_xlabel("coefficient")
    ax.set_title(f"{topic} ({sum(is_own)}/10 topic words)")
    print(f"{topic:>8}: {', '.join(words[top])}")
fig.suptitle("OrtLogisticRegression: the 10 largest coefficients per topic")
fig.tight_layout()
plt.show()
