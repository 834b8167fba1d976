"""The GAN of keras-io's guide "Writing a training loop from scratch in TensorFlow" (keras-team/keras-io,
guides/writing_a_custom_training_loop_in_tensorflow.py, Keras 3, last modified 2023/06/25, section "End-to-end
example: a GAN training loop from scratch"), with its prints as published: `Start epoch %d`,
`discriminator loss at step %d: %.2f`, `adversarial loss at step %d: %.2f` (two lines for one step).

Changes:
- synthetic MNIST-shaped images (the guide downloads MNIST): 48 batches of 64 images of 28x28x1 values in
  [0, 1), one epoch as in the guide;
- a print every step (the guide: every 100), and the whole epoch of 48 steps (the guide stops after 12 steps):
  48 printed steps, each a discriminator and an adversarial loss;
- no image saved at each print (the guide saves generated_img_{step}.png), no `summary()` of the discriminator;
- TensorFlow on 1 thread (intra- and inter-op);
- CORPUS_INJECT=nan:STEP or diverge:STEP (STEP: the 0-based step): before the step STEP, the discriminator's
  last Dense kernel is set to NaN (nan: both losses are NaN from then on), or both optimizers' learning rates
  are multiplied by 1000 (diverge);
- the truth sidecar written beside the log (RUN.truth.json, RUN from the CORPUS_RUN variable).

    cd tests/data/real
    CORPUS_RUN=gan_loop ../../../.venv/bin/python gan_loop.py > gan_loop.log 2>&1
    CORPUS_RUN=gan_loop.nan CORPUS_INJECT=nan:32 ../../../.venv/bin/python gan_loop.py > gan_loop.nan.log 2>&1
    CORPUS_RUN=gan_loop.diverge CORPUS_INJECT=diverge:32 ../../../.venv/bin/python gan_loop.py \\
        > gan_loop.diverge.log 2>&1

The truth's `printed` lists the discriminator's losses (the `discriminator loss` lines: tfrun's training loss is
the first name ending in `loss`, and the reader names them `discriminator_loss`); `"loss_name"` says so, and
`"adversarial"` lists the other line's losses in the same form. One epoch: `global` is the printed step; the
lines print no epoch, `epoch` is the one `Start epoch %d` prints before them (0). `inject.print` is the index in
`printed` of the first loss printed from STEP on.
"""

import json
import os

import keras
import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = os.environ.get("CORPUS_RUN", "gan_loop")
INJECT = os.environ.get("CORPUS_INJECT")
KIND, INJECT_STEP = (INJECT.split(":")[0], int(INJECT.split(":")[1])) if INJECT else (None, None)
EVERY, STEPS = 1, 48
keras.utils.set_random_seed(0)

discriminator = keras.Sequential(
    [
        keras.Input(shape=(28, 28, 1)),
        keras.layers.Conv2D(64, (3, 3), strides=(2, 2), padding="same"),
        keras.layers.LeakyReLU(negative_slope=0.2),
        keras.layers.Conv2D(128, (3, 3), strides=(2, 2), padding="same"),
        keras.layers.LeakyReLU(negative_slope=0.2),
        keras.layers.GlobalMaxPooling2D(),
        keras.layers.Dense(1),
    ],
    name="discriminator",
)

latent_dim = 128

generator = keras.Sequential(
    [
        keras.Input(shape=(latent_dim,)),
        # We want to generate 128 coefficients to reshape into a 7x7x128 map
        keras.layers.Dense(7 * 7 * 128),
        keras.layers.LeakyReLU(negative_slope=0.2),
        keras.layers.Reshape((7, 7, 128)),
        keras.layers.Conv2DTranspose(128, (4, 4), strides=(2, 2), padding="same"),
        keras.layers.LeakyReLU(negative_slope=0.2),
        keras.layers.Conv2DTranspose(128, (4, 4), strides=(2, 2), padding="same"),
        keras.layers.LeakyReLU(negative_slope=0.2),
        keras.layers.Conv2D(1, (7, 7), padding="same", activation="sigmoid"),
    ],
    name="generator",
)

# Instantiate one optimizer for the discriminator and another for the generator.
d_optimizer = keras.optimizers.Adam(learning_rate=0.0003)
g_optimizer = keras.optimizers.Adam(learning_rate=0.0004)

# Instantiate a loss function.
loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)


@tf.function
def train_step(real_images):
    # Sample random points in the latent space
    random_latent_vectors = tf.random.normal(shape=(batch_size, latent_dim))
    # Decode them to fake images
    generated_images = generator(random_latent_vectors)
    # Combine them with real images
    combined_images = tf.concat([generated_images, real_images], axis=0)

    # Assemble labels discriminating real from fake images
    labels = tf.concat([tf.ones((batch_size, 1)), tf.zeros((real_images.shape[0], 1))], axis=0)
    # Add random noise to the labels - important trick!
    labels += 0.05 * tf.random.uniform(labels.shape)

    # Train the discriminator
    with tf.GradientTape() as tape:
        predictions = discriminator(combined_images)
        d_loss = loss_fn(labels, predictions)
    grads = tape.gradient(d_loss, discriminator.trainable_weights)
    d_optimizer.apply(grads, discriminator.trainable_weights)

    # Sample random points in the latent space
    random_latent_vectors = tf.random.normal(shape=(batch_size, latent_dim))
    # Assemble labels that say "all real images"
    misleading_labels = tf.zeros((batch_size, 1))

    # Train the generator (note that we should *not* update the weights
    # of the discriminator)!
    with tf.GradientTape() as tape:
        predictions = discriminator(generator(random_latent_vectors))
        g_loss = loss_fn(misleading_labels, predictions)
    grads = tape.gradient(g_loss, generator.trainable_weights)
    g_optimizer.apply(grads, generator.trainable_weights)
    return d_loss, g_loss, generated_images


def inject(step):
    if step != INJECT_STEP:
        return
    if KIND == "nan":
        kernel = discriminator.layers[-1].kernel
        kernel.assign(np.full(kernel.shape, np.nan, dtype="float32"))
    elif KIND == "diverge":
        for opt in (d_optimizer, g_optimizer):
            opt.learning_rate.assign(opt.learning_rate * 1000)


# Prepare the dataset.
batch_size = 64
all_digits = np.random.default_rng(0).random((STEPS * batch_size, 28, 28, 1), dtype=np.float32)  # synthetic
dataset = tf.data.Dataset.from_tensor_slices(all_digits)
dataset = dataset.shuffle(buffer_size=1024).batch(batch_size)

epochs = 1  # In practice you need at least 20 epochs to generate nice digits.
printed, adversarial = [], []
first_after = None  # the index in `printed` of the first loss printed from the injection's step on

for epoch in range(epochs):
    print(f"\nStart epoch {epoch}")

    for step, real_images in enumerate(dataset):
        inject(step)
        # Train the discriminator & generator on one batch of real images.
        d_loss, g_loss, generated_images = train_step(real_images)

        # Logging.
        if step % EVERY == 0:
            # Print metrics
            print(f"discriminator loss at step {step}: {d_loss:.2f}")
            print(f"adversarial loss at step {step}: {g_loss:.2f}")
            printed.append({"epoch": epoch, "step": step, "global": step, "loss": float(d_loss)})
            adversarial.append({"epoch": epoch, "step": step, "global": step, "loss": float(g_loss)})
            if INJECT and first_after is None and step >= INJECT_STEP:
                first_after = len(printed) - 1

truth = {
    "script": "gan_loop.py",
    "source": "keras-team/keras-io guides/writing_a_custom_training_loop_in_tensorflow.py (GAN)",
    "framework": f"Keras {keras.__version__} / TensorFlow {tf.__version__}",
    "inject": {"kind": KIND, "step": INJECT_STEP, "print": first_after} if INJECT else None,
    "tolerance": 5e-03,
    "loss_name": "discriminator_loss",
    "printed": printed,
    "adversarial": adversarial,
}
with open(os.path.join(HERE, f"{RUN}.truth.json"), "w") as f:
    json.dump(truth, f, indent=1)
    f.write("\n")
