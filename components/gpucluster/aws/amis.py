"""What an AMI itself says at deploy time, for the launch templates built on it.

The root volume's settings (size, gp3, encryption) go on the AMI's root device: a mapping under
another name is an extra disk and leaves the root at the image's own defaults. That name differs by
distribution (`/dev/sda1` on Ubuntu, the Deep Learning AMIs included; `/dev/xvda` on Amazon Linux), so
it is read from the image (DescribeImages' RootDeviceName, through the provider's `aws.ec2.getAmi`
looked up by image id, which needs no owner filter to be safe). `gpucluster doctor` shows the same
field before deploy (`ops.amis`).
"""

from __future__ import annotations

import pulumi
import pulumi_aws as aws


def root_device(image_id: pulumi.Input[str], opts: pulumi.InvokeOptions) -> pulumi.Output[str]:
    """The root device name of the AMI `image_id` (an id, or the output of an SSM parameter's lookup)."""
    filters = pulumi.Output.from_input(image_id).apply(
        lambda image: [aws.ec2.GetAmiFilterArgs(name="image-id", values=[image])])
    return aws.ec2.get_ami_output(filters=filters, opts=opts).root_device_name
