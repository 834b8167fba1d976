"""How gan_loop.log was made: the GAN of keras-io's guide "Writing a training loop from scratch in TensorFlow"
(Keras 3), copied as published except: synthetic MNIST-shaped images (the guide downloads MNIST), a print every
5 steps and 60 steps (the guide: every 100, 200 steps).

    .venv/bin/python tests/data/real/gan_loop.py > tests/data/real/gan_loop.log 2>&1

Beside the log, gan_loop.truth.json: the step and both losses as the script computed them at each print.
"""

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras
import numpy as np
import tensorflow as tf
from keras import layers

HERE = os.path.dirname(os.path.abspath(__file__))
EVERY, STEPS = 5, 60
keras.utils.set_random_seed(0)

discriminator = keras.Sequential(
    [
        keras.Input(shape=(28, 28, 1)),
        layers.Conv2D(64, (3, 3), strides=(2, 2), padding="same"),
        layers.LeakyReLU(negative_slope=0.2),
        layers.Conv2D(128, (3, 3), strides=(2, 2), padding="same"),
        layers.LeakyReLU(negative_slope=0.2),
        layers.GlobalMaxPooling2D(),
        layers.Dense(1),
    ],
    name="discriminator",
)
latent_dim = 128
generator = keras.Sequential(
    [
        keras.Input(shape=(latent_dim,)),
        layers.Dense(7 * 7 * 128),
        layers.LeakyReLU(negative_slope=0.2),
        layers.Reshape((7, 7, 128)),
        layers.Conv2DTranspose(128, (4, 4), strides=(2, 2), padding="same"),
        layers.LeakyReLU(negative_slope=0.2),
        layers.Conv2DTranspose(128, (4, 4), strides=(2, 2), padding="same"),
        layers.LeakyReLU(negative_slope=0.2),
        layers.Conv2D(1, (7, 7), padding="same", activation="sigmoid"),
    ],
    name="generator",
)
d_optimizer = keras.optimizers.Adam(learning_rate=0.0003)
g_optimizer = keras.optimizers.Adam(learning_rate=0.0004)
loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)


@tf.function
def train_step(real_images):
    random_latent_vectors = tf.random.normal(shape=(batch_size, latent_dim))
    generated_images = generator(random_latent_vectors)
    combined_images = tf.concat([generated_images, real_images], axis=0)
    labels = tf.concat([tf.ones((batch_size, 1)), tf.zeros((real_images.shape[0], 1))], axis=0)
    labels += 0.05 * tf.random.uniform(labels.shape)
    with tf.GradientTape() as tape:
        predictions = discriminator(combined_images)
        d_loss = loss_fn(labels, predictions)
    grads = tape.gradient(d_loss, discriminator.trainable_weights)
    d_optimizer.apply(grads, discriminator.trainable_weights)
    random_latent_vectors = tf.random.normal(shape=(batch_size, latent_dim))
    misleading_labels = tf.zeros((batch_size, 1))
    with tf.GradientTape() as tape:
        predictions = discriminator(generator(random_latent_vectors))
        g_loss = loss_fn(misleading_labels, predictions)
    grads = tape.gradient(g_loss, generator.trainable_weights)
    g_optimizer.apply(grads, generator.trainable_weights)
    return d_loss, g_loss, generated_images


batch_size = 64
all_digits = np.random.default_rng(0).random((STEPS * batch_size, 28, 28, 1), dtype=np.float32)  # synthetic
dataset = tf.data.Dataset.from_tensor_slices(all_digits)
dataset = dataset.shuffle(buffer_size=1024).batch(batch_size)

truth = []
epochs = 1
for epoch in range(epochs):
    print(f"\nStart epoch {epoch}")
    for step, real_images in enumerate(dataset):
        d_loss, g_loss, generated_images = train_step(real_images)
        if step % EVERY == 0:
            print(f"discriminator loss at step {step}: {d_loss:.2f}")
            print(f"adversarial loss at step {step}: {g_loss:.2f}")
            truth.append({"step": step, "discriminator_loss": float(d_loss), "adversarial_loss": float(g_loss)})
        if step > STEPS:
            break

with open(os.path.join(HERE, "gan_loop.truth.json"), "w") as f:
    json.dump(truth, f, indent=0)
