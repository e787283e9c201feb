'use strict';
// A producer and a consumer on one queue while the test kills the broker: the same flow as
// tests/clients/ruby/failover.rb.
//
// Consumer session: SUBSCRIBE client-individual, take every MESSAGE and ACK it, until the
// marker "end"; a progress line {"progress": {"received": n}} every --every MESSAGEs tells
// the test when to kill. Producer session: SEND m0..m(N-1), persistent, each with a receipt
// awaited, --pace-ms apart; then "end" (receipt).
// Result: {"received": [bodies in order], "redelivered": n, "receipts": n}.

const { options, run, Session } = require('./common');

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

const opts = options({ count: 200, pace_ms: 5, every: 10 });
run('failover', opts.timeout, async (result) => {
  const dest = opts.dest;
  const consumer = await Session.open(opts, result);
  consumer.subscribe({ destination: dest, id: 'c', ack: 'client-individual' });
  const bodies = [];
  let redelivered = 0;
  const taking = (async () => {
    for (;;) {
      const message = await consumer.message();
      await consumer.ack(message);
      bodies.push(message.body);
      if (message.headers.redelivered === 'true') {
        redelivered += 1;
      }
      if (bodies.length % opts.every === 0) {
        result.progress({ received: bodies.length });
      }
      if (message.body === 'end') {
        return;
      }
    }
  })();

  const producer = await Session.open(opts, result);
  let receipts = 0;
  for (let i = 0; i < opts.count; i += 1) {
    await producer.send(dest, `m${i}`, { persistent: 'true' }, true);
    receipts += 1;
    await sleep(opts.pace_ms);
  }
  await producer.send(dest, 'end', { persistent: 'true' }, true);
  await taking;
  result.data.received = bodies;
  result.data.redelivered = redelivered;
  result.data.receipts = receipts;
  await producer.close();
  await consumer.close();
});
